//! The provider's request, receipt and ledger record types, and the rules for idempotency keys.

use super::error::ProviderError;
use super::prices;
use serde::{Deserialize, Serialize};

/// Header that marks a replayed answer.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// Header that carries the idempotency key.
pub use crate::keys::IDEMPOTENCY_HEADER as KEY_HEADER;

/// Width and height used when a request names none.
pub const DEFAULT_SIZE: u32 = 1024;
/// Smallest and largest accepted width or height, in pixels.
pub const SIZE_RANGE: std::ops::RangeInclusive<u32> = 64..=4096;
/// Longest accepted prompt, in characters.
pub const MAX_PROMPT_CHARS: usize = 4000;
/// Longest accepted idempotency key, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// What to generate: the body of `POST /v1/images`.
///
/// `model`, `width` and `height` may be left out of the JSON body and take their defaults, so
/// `{"prompt":"fox"}` and `{"prompt":"fox","model":"flux-schnell","width":1024,"height":1024}`
/// are the same request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRequest {
    /// What the image shows.
    pub prompt: String,
    /// Width in pixels.
    #[serde(default = "default_size")]
    pub width: u32,
    /// Height in pixels.
    #[serde(default = "default_size")]
    pub height: u32,
    /// Model name from [`prices::PRICES`].
    #[serde(default = "default_model")]
    pub model: String,
    /// The most the caller authorized for this image, in cents. A compliant provider refuses
    /// (`amount_above_maximum`, HTTP 422) rather than charge more. It is a condition on the
    /// charge, not part of what is asked for: it is left out of [`ImageRequest::fingerprint`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_amount_cents: Option<u64>,
}

fn default_size() -> u32 {
    DEFAULT_SIZE
}

fn default_model() -> String {
    prices::DEFAULT_MODEL.to_owned()
}

impl ImageRequest {
    /// A request for `prompt` with the default model and size.
    pub fn new(prompt: impl Into<String>) -> Self {
        ImageRequest {
            prompt: prompt.into(),
            width: DEFAULT_SIZE,
            height: DEFAULT_SIZE,
            model: default_model(),
            max_amount_cents: None,
        }
    }

    /// Checks the bounds and returns the price in cents; a price above
    /// [`max_amount_cents`](Self::max_amount_cents) is refused.
    pub fn validate(&self) -> Result<u64, ProviderError> {
        let invalid = |reason: String| Err(ProviderError::InvalidRequest { reason });
        let chars = self.prompt.chars().count();
        if self.prompt.trim().is_empty() {
            return invalid("`prompt` is empty; describe the image to generate".into());
        }
        if chars > MAX_PROMPT_CHARS {
            return invalid(format!(
                "`prompt` has {chars} characters, more than the {MAX_PROMPT_CHARS} allowed"
            ));
        }
        for (name, value) in [("width", self.width), ("height", self.height)] {
            if !SIZE_RANGE.contains(&value) {
                return invalid(format!(
                    "`{name}` is {value}; it must be between {} and {} pixels",
                    SIZE_RANGE.start(),
                    SIZE_RANGE.end()
                ));
            }
        }
        let price =
            prices::price_cents(&self.model).ok_or_else(|| ProviderError::UnknownModel {
                model: self.model.clone(),
            })?;
        match self.max_amount_cents {
            Some(max) if price > max => Err(ProviderError::AboveMaximum {
                model: self.model.clone(),
                price_cents: price,
                max_cents: max,
            }),
            _ => Ok(price),
        }
    }

    /// `sha256:<hex>` of the request's canonical JSON: two bodies are "the same request" exactly
    /// when their fingerprints match.
    pub fn fingerprint(&self) -> String {
        let asked = ImageRequest {
            max_amount_cents: None,
            ..self.clone()
        };
        let value = serde_json::to_value(&asked).expect("an ImageRequest always serializes");
        crate::canonical::request_hash("provider:v1/images", &value)
            .expect("an ImageRequest holds no unsafe numbers")
            .as_str()
            .to_owned()
    }
}

/// Checks an `Idempotency-Key`: 1 to 255 visible ASCII characters (`!` to `~`).
pub fn validate_key(key: &str) -> Result<(), ProviderError> {
    let reason = if key.is_empty() {
        "it is empty".to_owned()
    } else if key.len() > MAX_KEY_LEN {
        format!("it is {} bytes long, more than {MAX_KEY_LEN}", key.len())
    } else if let Some(pos) = key.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
        format!("byte {pos} is not visible ASCII (`!` to `~`)")
    } else {
        return Ok(());
    };
    Err(ProviderError::InvalidKey { reason })
}

/// The generated image, as the provider describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// The image's id at the provider.
    pub id: String,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `sha256` content digest of the image.
    pub sha256: String,
}

/// What the provider returns for a charge (the 200 body of `POST /v1/images`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The charge's id at the provider (`ch_<32 hex>`).
    pub charge_id: String,
    /// What was charged, in cents.
    pub amount_cents: u64,
    /// The model that was charged for.
    pub model: String,
    /// The image.
    pub image: Image,
    /// When the charge was recorded (RFC 3339, UTC).
    pub created_at: String,
}

/// The result of one `create_image`: the receipt, and whether it was replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeOutcome {
    /// The original receipt of the charge made under this key.
    pub receipt: Receipt,
    /// `true` when the key had already been charged and this is the original answer again.
    pub replayed: bool,
}

/// One row of the ledger, as `GET /v1/charges` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeRecord {
    /// The charge's id.
    pub charge_id: String,
    /// The idempotency key it was charged under.
    pub idempotency_key: String,
    /// What was charged, in cents.
    pub amount_cents: u64,
    /// The model.
    pub model: String,
    /// When (RFC 3339, UTC).
    pub created_at: String,
}

/// The body of `GET /v1/charges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargesPage {
    /// Every charge, oldest first.
    pub charges: Vec<ChargeRecord>,
    /// How many charges.
    pub count: u64,
    /// Their sum in cents.
    pub total_cents: u64,
}

impl ChargesPage {
    /// Builds the page from the records.
    pub fn new(charges: Vec<ChargeRecord>) -> Self {
        ChargesPage {
            count: charges.len() as u64,
            total_cents: charges.iter().map(|c| c.amount_cents).sum(),
            charges,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_rules() {
        let long = "k".repeat(255);
        let too_long = "k".repeat(256);
        for (key, ok) in [
            ("a", true),
            ("gongbu:0123abcd", true),
            ("!~", true),
            (long.as_str(), true),
            ("", false),
            (too_long.as_str(), false),
            ("has space", false),
            ("tab\t", false),
            ("é", false),
            ("nul\0", false),
        ] {
            assert_eq!(validate_key(key).is_ok(), ok, "{key:?}");
        }
        // The key callid derives for an operation is one the provider takes.
        let op = crate::keys::OperationKey::from_stored("hubu:operation:v1:codex:k1".into());
        validate_key(&op.idempotency_key()).unwrap();
    }

    #[test]
    fn request_defaults_and_bounds() {
        let short: ImageRequest = serde_json::from_str(r#"{"prompt":"fox"}"#).unwrap();
        let full: ImageRequest = serde_json::from_str(
            r#"{"model":"flux-schnell","height":1024,"width":1024,"prompt":"fox"}"#,
        )
        .unwrap();
        assert_eq!(short, full);
        assert_eq!(short.fingerprint(), full.fingerprint());
        assert_ne!(short.fingerprint(), ImageRequest::new("fox ").fingerprint());
        assert_eq!(short.validate().unwrap(), 3);
        assert!(serde_json::from_str::<ImageRequest>(r#"{"prompt":"x","seed":1}"#).is_err());

        let mut r = ImageRequest::new("fox");
        for (edit, code) in [
            (
                Box::new(|r: &mut ImageRequest| r.prompt = " ".into()) as Box<dyn Fn(&mut _)>,
                "invalid_request",
            ),
            (
                Box::new(|r: &mut ImageRequest| r.prompt = "x".repeat(4001)),
                "invalid_request",
            ),
            (
                Box::new(|r: &mut ImageRequest| r.width = 63),
                "invalid_request",
            ),
            (
                Box::new(|r: &mut ImageRequest| r.height = 4097),
                "invalid_request",
            ),
            (
                Box::new(|r: &mut ImageRequest| r.model = "dall-e".into()),
                "unknown_model",
            ),
        ] {
            let mut bad = r.clone();
            edit(&mut bad);
            assert_eq!(bad.validate().unwrap_err().code(), code, "{bad:?}");
        }
        r.model = "flux-pro".into();
        assert_eq!(r.validate().unwrap(), 25);
        let fingerprint = r.fingerprint();
        for (max, ok) in [
            (Some(25), true),
            (Some(100), true),
            (Some(24), false),
            (None, true),
        ] {
            r.max_amount_cents = max;
            assert_eq!(r.fingerprint(), fingerprint, "{max:?}");
            match r.validate() {
                Ok(price) => assert!(ok && price == 25, "{max:?}"),
                Err(e) => {
                    assert!(!ok, "{max:?}");
                    assert_eq!((e.code(), e.status()), ("amount_above_maximum", 422));
                    assert!(!e.is_transient());
                }
            }
        }
    }
}
