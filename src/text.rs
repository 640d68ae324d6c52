//! Text helpers every renderer and message shares: cutting a string to a byte budget without
//! splitting a character ([`cut`], [`clip`]), GitHub-flavoured Markdown table cells
//! ([`markdown_cell`], [`markdown_code`]), the end of a program's output on one line
//! (`last_lines`, with the `test-hooks` feature), and the nearest of several names to a mistyped one ([`edits`],
//! [`nearest`], and [`misspelling_of`] when only a near one will do).
//!
//! # Guarantees
//! - [`cut`] and [`clip`] never panic and never split a UTF-8 character: they keep the longest
//!   prefix of at most `max` bytes that ends on a character boundary.
//! - A cell from [`markdown_cell`] or [`markdown_code`] stays one cell of one row whatever the
//!   input: every `|` is escaped as `\|` (GFM unescapes it even inside a code span) and every line
//!   break becomes a space. A text cell also shows `<`, `>` and `&` as written instead of reading
//!   them as HTML (client names come from the client and may hold anything); a code cell shows
//!   every character but `|` and line breaks as written, backticks included.

/// The longest prefix of `text` that is at most `max` bytes and ends on a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// [`cut`], followed by `…` when something was cut off.
pub fn clip(text: &str, max: usize) -> String {
    let kept = cut(text, max);
    if kept.len() == text.len() {
        kept.to_string()
    } else {
        format!("{kept}…")
    }
}

/// `text` as the content of a Markdown table cell: `|` escaped, line breaks as spaces, and
/// `<`, `>`, `&` as character references so that nothing is read as HTML.
pub fn markdown_cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '|' => out.push_str("\\|"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// `text` as a code span for a Markdown table cell: `|` escaped, line breaks as spaces, and a
/// backtick fence longer than any run of backticks inside, so a backtick in `text` shows as one.
pub fn markdown_code(text: &str) -> String {
    let flat = one_line(text);
    let longest_run = flat.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest_run + 1);
    // A space on each side keeps a leading or trailing backtick apart from the fence; CommonMark
    // strips one such space from each side.
    let pad = if flat.starts_with('`') || flat.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{}{pad}{fence}", flat.replace('|', "\\|"))
}

/// `text` with every line break (`\r\n`, `\n`, `\r`) as one space.
fn one_line(text: &str) -> String {
    text.replace("\r\n", " ").replace(['\n', '\r'], " ")
}

/// The last `n` non-empty lines of `text` (a program's standard error), joined with ` | ` so
/// they stay on one line of a message.
#[cfg(any(test, feature = "test-hooks"))]
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Optimal string alignment distance: insertions, deletions, substitutions and transpositions of
/// adjacent characters, each one edit (so `stdoi` is one edit from `stdio`).
pub fn edits(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// The candidate with the fewest [`edits`] from `given` (the first of equals), if any.
pub fn nearest<'a>(given: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .enumerate()
        .min_by_key(|(i, c)| (edits(given, c), *i))
        .map(|(_, c)| c)
}

/// The [`nearest`] candidate when it is near enough to be a misspelling of `given`: at most a
/// third of the longer name's characters away, and at least one edit allowed (`complete` finds
/// `completed`, `restat` finds `restart`).
pub fn misspelling_of<'a>(
    given: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    nearest(given, candidates).filter(|near| {
        let longer = given.chars().count().max(near.chars().count());
        edits(given, near) <= (longer / 3).max(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_count_a_transposition_as_one_and_nearest_takes_the_first_of_equals() {
        for (a, b, n) in [
            ("lgo", "log", 1),
            ("log", "log", 0),
            ("lo", "log", 1),
            ("lgoo", "log", 2),
            ("", "ab", 2),
            ("registyr", "registry", 1),
            ("é", "e", 1),
        ] {
            assert_eq!(edits(a, b), n, "{a} -> {b}");
        }
        assert_eq!(nearest("ab", ["xy", "ac", "ad"]), Some("ac"));
        assert_eq!(nearest("ab", []), None);
    }

    #[test]
    fn cut_keeps_whole_characters_within_the_budget() {
        for (text, max, want) in [
            ("", 3, ""),
            ("abc", 3, "abc"),
            ("abcd", 3, "abc"),
            ("aé", 2, "a"),
            ("aé", 3, "aé"),
            ("日本", 5, "日"),
            ("日本", 2, ""),
            ("🦀x", 3, ""),
            ("🦀x", 4, "🦀"),
        ] {
            assert_eq!(cut(text, max), want, "cut({text:?}, {max})");
        }
    }

    #[test]
    fn clip_marks_what_it_cut() {
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("abcd", 3), "abc…");
        assert_eq!(clip("日本", 4), "日…");
    }

    #[test]
    fn a_text_cell_is_one_cell_and_no_html() {
        for (text, want) in [
            ("plain", "plain"),
            ("a|b", "a\\|b"),
            ("a\nb\r\nc\rd", "a b c d"),
            ("<script>&", "&lt;script&gt;&amp;"),
            ("a|b <c>\nd&", "a\\|b &lt;c&gt; d&amp;"),
        ] {
            assert_eq!(markdown_cell(text), want, "{text:?}");
        }
    }

    #[test]
    fn a_code_cell_shows_its_text_in_one_cell() {
        for (text, want) in [
            ("callId", "`callId`"),
            ("a|b", "`a\\|b`"),
            ("x-codex\nturn", "`x-codex turn`"),
            ("a`b", "``a`b``"),
            ("`x", "`` `x ``"),
            ("a``b`", "``` a``b` ```"),
            ("<a&b>", "`<a&b>`"),
        ] {
            assert_eq!(markdown_code(text), want, "{text:?}");
        }
    }

    #[test]
    fn last_lines_keeps_the_end_without_blank_lines() {
        for (text, n, want) in [
            ("", 5, ""),
            ("one", 5, "one"),
            ("a\n\n  \nb\nc\n", 2, "b | c"),
            ("a\nb\nc", 5, "a | b | c"),
            ("a\nb\nc", 0, ""),
        ] {
            assert_eq!(last_lines(text, n), want, "last_lines({text:?}, {n})");
        }
    }

    #[test]
    fn misspelling_of_finds_a_misspelling_and_nothing_far() {
        let statuses = [
            "pending",
            "awaiting_approval",
            "completed",
            "denied",
            "failed",
        ];
        for (name, want) in [
            ("complete", Some("completed")),
            ("compelted", Some("completed")),
            ("denied", Some("denied")),
            ("fail", Some("failed")),
            ("done", None),
            ("", None),
            ("x", None),
        ] {
            assert_eq!(misspelling_of(name, statuses), want, "{name:?}");
        }
        assert_eq!(
            misspelling_of("missing_identiy", ["invalid_identity", "missing_identity"]),
            Some("missing_identity")
        );
        assert_eq!(
            misspelling_of("restat", ["restart", "kill"]),
            Some("restart")
        );
        assert_eq!(misspelling_of("stdoi", ["stdio", "http"]), Some("stdio"));
        assert_eq!(
            misspelling_of("b", ["a", "c"]),
            Some("a"),
            "a tie goes to the first"
        );
    }
}
