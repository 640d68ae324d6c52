//! POSIX shell quoting: one word quoted ([`shell_quote`]) and a command line split back into
//! words ([`split_words`]), with no expansion of any kind.

/// `word` quoted for a POSIX shell (as is when it needs no quoting); [`split_words`] reads it
/// back.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Splits a command line into words like a POSIX shell does for quotes and backslashes (no
/// expansion of any kind). `None` on an unbalanced quote.
pub fn split_words(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => word.push(c),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            c @ ('"' | '\\' | '$' | '`') => word.push(c),
                            c => {
                                word.push('\\');
                                word.push(c);
                            }
                        },
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.push(chars.next()?);
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_words_follows_shell_quoting() {
        let cases: &[(&str, Option<&[&str]>)] = &[
            (
                "python3 router.py --flaw x",
                Some(&["python3", "router.py", "--flaw", "x"]),
            ),
            (
                "  a   'b c'  \"d \\\" e\" f\\ g ",
                Some(&["a", "b c", "d \" e", "f g"]),
            ),
            ("''", Some(&[""])),
            ("", Some(&[])),
            ("a 'b", None),
            ("a \"b", None),
        ];
        for (line, want) in cases {
            let got = split_words(line);
            assert_eq!(
                got.as_deref()
                    .map(|w| w.iter().map(String::as_str).collect::<Vec<_>>()),
                want.map(|w| w.to_vec()),
                "{line:?}"
            );
        }
    }

    #[test]
    fn a_quoted_word_splits_back_to_itself() {
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(split_words(&shell_quote("it's")).unwrap(), ["it's"]);
    }
}
