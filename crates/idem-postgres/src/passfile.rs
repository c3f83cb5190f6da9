//! The `passfile` parameter of a PostgreSQL URL, read as libpq reads it.
//!
//! sqlx reads `PGPASSFILE` and `~/.pgpass` by itself, but ignores the
//! `passfile` parameter of a URL; this reads the file that one names. Each
//! line is `host:port:database:user:password`, any of the first four may be
//! `*`, `\:` and `\\` stand for `:` and `\`, and lines that are empty or start
//! with `#` are skipped. The first line that matches wins.

use std::path::Path;

/// Where the password is wanted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    pub(crate) database: &'a str,
    pub(crate) user: &'a str,
}

/// The password `path` holds for `target`, if a line matches.
pub(crate) fn lookup(path: &Path, target: Target<'_>) -> std::io::Result<Option<String>> {
    let text = std::fs::read_to_string(path)?;
    Ok(find(&text, target))
}

fn find(text: &str, target: Target<'_>) -> Option<String> {
    let port = target.port.to_string();
    let wanted = [target.host, port.as_str(), target.database, target.user];
    text.lines()
        .map(|line| line.trim_end_matches('\r'))
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(fields)
        .find(|fields| {
            fields[..4]
                .iter()
                .zip(wanted)
                .all(|(field, wanted)| field == "*" || field == wanted)
        })
        .map(|mut fields| fields.swap_remove(4))
}

/// A line's five fields, unescaped; `None` for a line with fewer.
fn fields(line: &str) -> Option<Vec<String>> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut()?.push(chars.next().unwrap_or('\\')),
            // The password is the rest of the line, colons and all.
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut()?.push(c),
        }
    }
    (fields.len() == 5).then_some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: Target<'static> = Target {
        host: "db.example",
        port: 5432,
        database: "orders",
        user: "app",
    };

    #[test]
    fn the_first_matching_line_wins_and_wildcards_match_anything() {
        let text = "# a comment\n\
                    \n\
                    other:5432:*:app:not-this\n\
                    db.example:5433:*:app:nor-this\n\
                    db.example:5432:orders:app:this\n\
                    *:*:*:*:fallback\n";
        assert_eq!(find(text, TARGET).as_deref(), Some("this"));
        let text = "*:*:*:app:fallback\n";
        assert_eq!(find(text, TARGET).as_deref(), Some("fallback"));
        assert_eq!(find("*:*:*:someone:x\n", TARGET), None);
        assert_eq!(find("too:few:fields\n", TARGET), None);
    }

    #[test]
    fn escaped_colons_and_backslashes_are_read_back() {
        let text = "db.example:5432:orders:app:pa\\:ss\\\\word\n";
        assert_eq!(find(text, TARGET).as_deref(), Some("pa:ss\\word"));
        let text = "db.example:5432:orders:app:rest:of:line\r\n";
        assert_eq!(find(text, TARGET).as_deref(), Some("rest:of:line"));
    }
}
