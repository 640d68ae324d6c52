//! Byte framing of client messages: whole messages out of a byte stream, bounded in memory.
//!
//! [`LineFramer`] splits a newline-delimited stream (stdio, `--wrap`) into [`Frame`]s;
//! [`Accumulator`] collects one message (an HTTP body, a line); [`Skimmer`] finds a message's
//! top-level `id` and `method` without parsing it whole. The [`tap`](super::tap) decides what a
//! frame means; this module only says where a message starts and ends.
//!
//! # Guarantees
//! - A message of at most [`MAX_MESSAGE_BYTES`] is kept whole ([`Frame::Message`]); a longer one
//!   is never buffered whole: its bytes are counted and skimmed ([`Frame::Oversize`]), so memory
//!   stays bounded whatever a client sends.
//! - The skimmer uses constant memory and no recursion, whatever the message's size or depth; it
//!   keeps an `id` or `method` token of at most 1 KiB.
//! - Blank lines are skipped; a last line without a newline is still a message.

use serde_json::Value;

/// Longest message recorded in full, in bytes (1 MiB).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Longest id or method token the skimmer keeps.
const MAX_SKIM_TOKEN: usize = 1024;

/// One complete client message, or the facts about one too long to keep.
#[derive(Debug)]
pub enum Frame {
    /// A message of at most [`MAX_MESSAGE_BYTES`].
    Message(Vec<u8>),
    /// A longer message: its length and what the skimmer found.
    Oversize {
        /// Total bytes.
        len: usize,
        /// Top-level `id` and `method`, if found.
        skim: Skim,
    },
}

/// The top-level `id` and `method` of a message, found without parsing it whole.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Skim {
    /// The `id`, when it is a string, number or null of at most 1 KiB.
    pub id: Option<Value>,
    /// The `method`, when it is a string of at most 1 KiB.
    pub method: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Id,
    Method,
    Other,
}

/// An incremental scanner that finds the top-level `id` and `method` of a JSON object in a byte
/// stream, with constant memory and no recursion, whatever the message's size or depth.
#[derive(Debug, Default)]
pub struct Skimmer {
    depth: usize,
    in_string: bool,
    escape: bool,
    expect_key: bool,
    key: Vec<u8>,
    in_key: bool,
    field: Option<Field>,
    value: Vec<u8>,
    in_value: bool,
    value_is_string: bool,
    value_overflow: bool,
    found: Skim,
}

impl Skimmer {
    /// Skims one whole message.
    pub fn skim(bytes: &[u8]) -> Skim {
        let mut s = Skimmer::default();
        s.feed(bytes);
        s.finish()
    }

    /// Feeds the next bytes of the message.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    /// What was found.
    pub fn finish(mut self) -> Skim {
        if self.in_value && !self.value_is_string {
            self.end_value();
        }
        self.found
    }

    fn byte(&mut self, b: u8) {
        if self.in_string {
            if self.in_key {
                if self.key.len() < 16 {
                    self.key.push(b);
                }
            } else if self.in_value {
                self.push_value(b);
            }
            if self.escape {
                self.escape = false;
            } else if b == b'\\' {
                self.escape = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.in_key {
                    self.in_key = false;
                    self.key.pop();
                } else if self.in_value {
                    self.end_value();
                }
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.in_key = true;
                    self.key.clear();
                } else if self.depth == 1 && self.field.is_some() && !self.in_value {
                    self.start_value(true);
                    self.push_value(b);
                }
            }
            b'{' | b'[' => {
                if self.depth == 1 {
                    // A compound id is not skimmed.
                    self.field = None;
                }
                self.depth += 1;
                self.expect_key = self.depth == 1 && b == b'{';
            }
            b'}' | b']' => {
                if self.depth == 1 && self.in_value {
                    self.end_value();
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b':' if self.depth == 1 => {
                self.expect_key = false;
                self.field = Some(match self.key.as_slice() {
                    b"id" => Field::Id,
                    b"method" => Field::Method,
                    _ => Field::Other,
                });
            }
            b',' if self.depth == 1 => {
                if self.in_value {
                    self.end_value();
                }
                self.field = None;
                self.expect_key = true;
            }
            b' ' | b'\t' | b'\n' | b'\r' => {
                if self.depth == 1 && self.in_value && !self.value_is_string {
                    self.end_value();
                }
            }
            _ => {
                if self.depth == 1 && self.field.is_some() {
                    if !self.in_value {
                        self.start_value(false);
                    }
                    self.push_value(b);
                }
            }
        }
    }

    fn start_value(&mut self, is_string: bool) {
        self.in_value = true;
        self.value_is_string = is_string;
        self.value_overflow = false;
        self.value.clear();
    }

    fn push_value(&mut self, b: u8) {
        if self.value.len() < MAX_SKIM_TOKEN {
            self.value.push(b);
        } else {
            self.value_overflow = true;
        }
    }

    fn end_value(&mut self) {
        self.in_value = false;
        let field = self.field.take();
        if self.value_overflow {
            return;
        }
        let Ok(value) = serde_json::from_slice::<Value>(&self.value) else {
            return;
        };
        match (field, value) {
            (Some(Field::Id), v @ (Value::String(_) | Value::Number(_) | Value::Null)) => {
                self.found.id = Some(v)
            }
            (Some(Field::Method), Value::String(m)) => self.found.method = Some(m),
            _ => {}
        }
    }
}

/// Collects one message up to [`MAX_MESSAGE_BYTES`]; past that, counts and skims instead.
#[derive(Debug, Default)]
pub struct Accumulator {
    buf: Vec<u8>,
    len: usize,
    skimmer: Option<Skimmer>,
}

impl Accumulator {
    /// Adds the next bytes of the message.
    pub fn push(&mut self, bytes: &[u8]) {
        self.len += bytes.len();
        if let Some(s) = &mut self.skimmer {
            s.feed(bytes);
        } else if self.buf.len() + bytes.len() > MAX_MESSAGE_BYTES {
            let mut s = Skimmer::default();
            s.feed(&self.buf);
            s.feed(bytes);
            self.buf = Vec::new();
            self.skimmer = Some(s);
        } else {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// The message, and a fresh accumulator in place of this one.
    pub fn take(&mut self) -> Frame {
        let done = std::mem::take(self);
        match done.skimmer {
            None => Frame::Message(done.buf),
            Some(s) => Frame::Oversize {
                len: done.len,
                skim: s.finish(),
            },
        }
    }
}

/// Splits a byte stream into newline-delimited messages, each bounded by an [`Accumulator`].
/// Blank lines are skipped.
#[derive(Debug, Default)]
pub struct LineFramer {
    current: Accumulator,
}

impl LineFramer {
    /// Feeds bytes; every completed line is appended to `out`.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<Frame>) {
        while let Some(nl) = bytes.iter().position(|b| *b == b'\n') {
            self.current.push(&bytes[..nl]);
            self.finish_line(out);
            bytes = &bytes[nl + 1..];
        }
        self.current.push(bytes);
    }

    /// Ends the stream: a last line without a newline is still a message.
    pub fn finish(&mut self, out: &mut Vec<Frame>) {
        self.finish_line(out);
    }

    fn finish_line(&mut self, out: &mut Vec<Frame>) {
        let frame = self.current.take();
        if let Frame::Message(m) = &frame
            && m.iter().all(|b| b.is_ascii_whitespace())
        {
            return;
        }
        out.push(frame);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn skimmer_table() {
        let cases: Vec<(&str, Option<Value>, Option<&str>)> = vec![
            (
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#,
                Some(json!(7)),
                Some("tools/call"),
            ),
            (
                r#"{"method":"x","params":{"id":1,"method":"inner"},"id":"a\"b"}"#,
                Some(json!("a\"b")),
                Some("x"),
            ),
            (
                r#"{ "id" : -1.5 , "method" : "m" }"#,
                Some(json!(-1.5)),
                Some("m"),
            ),
            (r#"{"id":null}"#, Some(Value::Null), None),
            (r#"{"id":{"x":1},"method":"m"}"#, None, Some("m")),
            (
                r#"{"params":{"_meta":[[[[[[]]]]]]},"id":3"#,
                Some(json!(3)),
                None,
            ),
            (r#"[{"id":1}]"#, None, None),
            (r#"not json"#, None, None),
        ];
        for (input, id, method) in cases {
            let skim = Skimmer::skim(input.as_bytes());
            assert_eq!(skim.id, id, "{input}");
            assert_eq!(skim.method.as_deref(), method, "{input}");
        }
    }

    #[test]
    fn skimmer_is_incremental() {
        let msg = r#"{"jsonrpc":"2.0","method":"tools/call","params":{"a":"xxxx"},"id":"req-9"}"#;
        for split in 0..msg.len() {
            let mut s = Skimmer::default();
            s.feed(&msg.as_bytes()[..split]);
            s.feed(&msg.as_bytes()[split..]);
            let skim = s.finish();
            assert_eq!(skim.id, Some(json!("req-9")));
            assert_eq!(skim.method.as_deref(), Some("tools/call"));
        }
    }

    #[test]
    fn framer_bounds_lines() {
        let mut f = LineFramer::default();
        let mut out = Vec::new();
        let big = format!(
            r#"{{"id":5,"method":"m","params":{{"x":"{}"}}}}"#,
            "a".repeat(MAX_MESSAGE_BYTES)
        );
        f.push(b"{\"id\":1}\n\n  \n", &mut out);
        for chunk in big.as_bytes().chunks(8192) {
            f.push(chunk, &mut out);
        }
        f.push(b"\n{\"id\":2}", &mut out);
        f.finish(&mut out);
        assert_eq!(out.len(), 3);
        assert!(matches!(&out[0], Frame::Message(m) if m == b"{\"id\":1}"));
        match &out[1] {
            Frame::Oversize { len, skim } => {
                assert_eq!(*len, big.len());
                assert_eq!(skim.id, Some(json!(5)));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(&out[2], Frame::Message(m) if m == b"{\"id\":2}"));
    }
}
