//! The provider's price table: the one place in callid where an image's price is decided.
//!
//! The router quotes from it, the authorization layer reserves from it and the provider charges
//! from it, so the three can never disagree. Prices are whole US cents per image, whatever its size.

/// The model used when a request names none.
pub const DEFAULT_MODEL: &str = "flux-schnell";

/// Every model the provider sells, with its price in cents per image.
pub const PRICES: &[(&str, u64)] = &[("flux-schnell", 3), ("flux-dev", 5), ("flux-pro", 25)];

/// The price of one image from `model`, or `None` when the provider does not sell it.
pub fn price_cents(model: &str) -> Option<u64> {
    PRICES
        .iter()
        .find(|(name, _)| *name == model)
        .map(|(_, cents)| *cents)
}

/// The names of every model, in table order (for error messages and `capabilities`).
pub fn models() -> impl Iterator<Item = &'static str> {
    PRICES.iter().map(|(name, _)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        for (model, cents) in [
            ("flux-schnell", Some(3)),
            ("flux-dev", Some(5)),
            ("flux-pro", Some(25)),
            ("FLUX-PRO", None),
            ("", None),
            ("dall-e", None),
        ] {
            assert_eq!(price_cents(model), cents, "{model}");
        }
        assert_eq!(price_cents(DEFAULT_MODEL), Some(3));
        assert_eq!(
            models().collect::<Vec<_>>(),
            ["flux-schnell", "flux-dev", "flux-pro"]
        );
    }
}
