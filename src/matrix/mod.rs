//! The support matrix: data in `matrices/`, rendered as Markdown.
