//! `--check`: compares the committed `SUPPORT.md` with what the data renders, and summarizes the
//! difference so a reader knows what changed without running a diff tool.

/// How a committed file differs from the rendered text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// First line (1-based) that differs.
    pub first_line: usize,
    /// That line as the data renders it (`None` past the end).
    pub expected: Option<String>,
    /// That line as committed (`None` past the end, or when the file is missing).
    pub found: Option<String>,
    /// Lines in the rendered text.
    pub expected_lines: usize,
    /// Lines in the committed file.
    pub found_lines: usize,
    /// Lines that differ position by position.
    pub differing_lines: usize,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "first difference at line {}; {} line(s) differ; rendered {} line(s), committed {}",
            self.first_line, self.differing_lines, self.expected_lines, self.found_lines
        )?;
        writeln!(f, "  rendered:  {}", show(self.expected.as_deref()))?;
        write!(f, "  committed: {}", show(self.found.as_deref()))
    }
}

fn show(line: Option<&str>) -> String {
    match line {
        // Debug formatting makes trailing spaces, tabs and `\r` visible.
        Some(l) => format!("{:?}", crate::text::cut(l, 160)),
        None => "(no such line)".into(),
    }
}

/// `None` when `found` is byte for byte `expected`.
pub fn compare(expected: &str, found: &str) -> Option<Difference> {
    if expected == found {
        return None;
    }
    // split_inclusive keeps line endings, so a missing final newline or a `\r` counts.
    let e: Vec<&str> = expected.split_inclusive('\n').collect();
    let f: Vec<&str> = found.split_inclusive('\n').collect();
    let n = e.len().max(f.len());
    let mut first = None;
    let mut differing = 0;
    for i in 0..n {
        if e.get(i) != f.get(i) {
            differing += 1;
            first.get_or_insert(i);
        }
    }
    let i = first.unwrap_or(0);
    Some(Difference {
        first_line: i + 1,
        expected: e.get(i).map(|l| l.to_string()),
        found: f.get(i).map(|l| l.to_string()),
        expected_lines: e.len(),
        found_lines: f.len(),
        differing_lines: differing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_byte_is_a_difference() {
        let a = "# x\n| a | b |\nend\n";
        assert!(compare(a, a).is_none());
        let cases = [
            ("# x\n| a | c |\nend\n", 2, 1),
            ("# x\n| a | b |\nend", 3, 1),
            ("# x\n| a | b |\nend\n\n", 4, 1),
            ("# x\r\n| a | b |\nend\n", 1, 1),
            ("", 1, 3),
        ];
        for (found, line, count) in cases {
            let d = compare(a, found).expect("differs");
            assert_eq!(
                (d.first_line, d.differing_lines),
                (line, count),
                "{found:?}"
            );
        }
    }
}
