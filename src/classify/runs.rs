//! The runs a measurement records for one client ([`Scenario`]), the names of their logs, and
//! the model tool-call ids each run scripts.
//!
//! One owner for what three places must agree on: `callid measure` writes the logs under these
//! names and scripts these ids, `classify` tells a run's kind from a log's name
//! ([`super::kinds::RunKind::of_file`]), and `matrix --check` finds each run of a row's evidence
//! by name and checks its id origin against these ids.
//!
//! A log name is `BASE.jsonl` for the main run and `BASE.TAG.jsonl` for the others, `TAG` being
//! [`Scenario::tag`]. Names are part of the committed evidence in `matrices/`: never rename one.

/// The runs `measure` records, each in a fresh home with a fresh probe log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Two distinct model tool calls, then final text: the verdict, the keys, (a) and the
    /// origin of the ID.
    TwoCalls,
    /// The model returns the same tool-call id twice: (b).
    DuplicateModelId,
    /// The probe is frozen while the first call is in flight: (c), timeout.
    Timeout,
    /// The server behind the probe dies while the first call is in flight: (c), death.
    ServerDies,
    /// One model answer with two tool calls of distinct ids and different arguments: (d).
    OneAnswerTwoIds,
    /// One model answer with two tool calls sharing one id, with different arguments: (e).
    OneAnswerSameId,
}

impl Scenario {
    /// Every scenario, in the order they run.
    pub const ALL: [Scenario; 6] = [
        Scenario::TwoCalls,
        Scenario::DuplicateModelId,
        Scenario::Timeout,
        Scenario::ServerDies,
        Scenario::OneAnswerTwoIds,
        Scenario::OneAnswerSameId,
    ];

    /// Name used in evidence file names (empty for the main evidence).
    pub fn tag(self) -> &'static str {
        match self {
            Scenario::TwoCalls => "",
            Scenario::DuplicateModelId => "duplicate-id",
            Scenario::Timeout => "timeout",
            Scenario::ServerDies => "server-dies",
            Scenario::OneAnswerTwoIds => "one-answer",
            Scenario::OneAnswerSameId => "one-answer-same-id",
        }
    }

    /// The name a person reads in messages and progress lines.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::TwoCalls => "two tool calls in two turns",
            Scenario::DuplicateModelId => "one tool-call id repeated in two turns",
            Scenario::Timeout => "server frozen mid-call",
            Scenario::ServerDies => "server dies mid-call",
            Scenario::OneAnswerTwoIds => "two tool calls in one answer",
            Scenario::OneAnswerSameId => "two tool calls sharing one id in one answer",
        }
    }

    /// Whether the model hands out all of this run's tool calls in one answer (every other run
    /// hands out one per turn).
    pub fn one_answer(self) -> bool {
        matches!(self, Scenario::OneAnswerTwoIds | Scenario::OneAnswerSameId)
    }

    /// The arguments of this run's tool calls, one per model id, as the probe's tool receives
    /// them: empty, except in the one-answer runs, where each call carries its own `note` so the
    /// evidence shows which of the two reached the server.
    pub fn call_arguments(self) -> Vec<serde_json::Value> {
        if self.one_answer() {
            ONE_ANSWER_NOTES
                .iter()
                .map(|note| serde_json::json!({ "note": note }))
                .collect()
        } else {
            vec![serde_json::json!({}); self.model_ids(IdStyle::OpenAi).len()]
        }
    }

    /// The log file name of this run for `base` (`codex-0.171.0`): `base.jsonl` or
    /// `base.TAG.jsonl`.
    pub fn log_name(self, base: &str) -> String {
        match self.tag() {
            "" => format!("{base}.jsonl"),
            tag => format!("{base}.{tag}.jsonl"),
        }
    }

    /// The run a log holds, from its file name (any other name is a main run).
    pub fn of_file(name: &str) -> Scenario {
        Scenario::ALL
            .into_iter()
            .find(|s| !s.tag().is_empty() && name.ends_with(&format!(".{}.jsonl", s.tag())))
            .unwrap_or(Scenario::TwoCalls)
    }

    /// The model's tool-call ids this run scripts, in order, in the vendor's id `style`.
    pub fn model_ids(self, style: IdStyle) -> Vec<String> {
        match self {
            Scenario::TwoCalls => vec![
                style.model_call_id("twocalls", 1),
                style.model_call_id("twocalls", 2),
            ],
            Scenario::DuplicateModelId => {
                let id = style.model_call_id("duplicate", 1);
                vec![id.clone(), id]
            }
            Scenario::Timeout => vec![style.model_call_id("timeout", 1)],
            Scenario::ServerDies => vec![style.model_call_id("dies", 1)],
            Scenario::OneAnswerTwoIds => vec![
                style.model_call_id("oneanswer", 1),
                style.model_call_id("oneanswer", 2),
            ],
            Scenario::OneAnswerSameId => {
                let id = style.model_call_id("oneanswersame", 1);
                vec![id.clone(), id]
            }
        }
    }
}

/// The `note` argument of the first and the second call of a one-answer run.
pub const ONE_ANSWER_NOTES: [&str; 2] = ["first", "second"];

/// The shape of a model vendor's tool-call ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdStyle {
    /// Anthropic's Messages API: `toolu_` + 24 base62.
    Anthropic,
    /// OpenAI's and Google's APIs: `call_` + 24 alphanumerics.
    OpenAi,
}

impl IdStyle {
    /// The model's tool-call id for call number `n` of scenario `tag`, fixed so evidence can be
    /// checked against it.
    pub fn model_call_id(self, tag: &str, n: usize) -> String {
        let mut body = format!("callidmeasure{tag}{n}");
        body.retain(|c| c.is_ascii_alphanumeric());
        while body.len() < 24 {
            body.push('0');
        }
        body.truncate(24);
        match self {
            IdStyle::Anthropic => format!("toolu_{body}"),
            IdStyle::OpenAi => format!("call_{body}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_log_name_reads_back_as_its_run() {
        for scenario in Scenario::ALL {
            let name = scenario.log_name("codex-0.171.0");
            assert_eq!(Scenario::of_file(&name), scenario, "{name}");
            assert_eq!(Scenario::of_file(&format!("m/evidence/{name}")), scenario);
        }
        assert_eq!(
            Scenario::log_name(Scenario::Timeout, "gemini-0.1"),
            "gemini-0.1.timeout.jsonl"
        );
        assert_eq!(Scenario::of_file("probe.log"), Scenario::TwoCalls);
        assert_eq!(Scenario::of_file("x.timeout.log"), Scenario::TwoCalls);
    }

    #[test]
    fn model_ids_have_the_vendor_shape() {
        assert_eq!(
            IdStyle::OpenAi.model_call_id("dup", 1),
            "call_callidmeasuredup10000000"
        );
        let ids = Scenario::TwoCalls.model_ids(IdStyle::Anthropic);
        assert_eq!(ids.len(), 2);
        assert_ne!(ids[0], ids[1]);
        assert!(
            ids.iter()
                .all(|id| id.starts_with("toolu_") && id.len() == 30)
        );
        let dup = Scenario::DuplicateModelId.model_ids(IdStyle::OpenAi);
        assert_eq!(dup[0], dup[1]);
        let same = Scenario::OneAnswerSameId.model_ids(IdStyle::OpenAi);
        assert_eq!(same[0], same[1]);
        assert_ne!(same[0], dup[0]);
        let args = Scenario::OneAnswerSameId.call_arguments();
        assert_ne!(args[0], args[1]);
        for scenario in Scenario::ALL {
            assert_eq!(
                scenario.call_arguments().len(),
                scenario.model_ids(IdStyle::OpenAi).len()
            );
        }
    }
}
