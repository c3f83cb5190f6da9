//! Values written into SQL text as literals, for the few statements that must go
//! as simple queries (several statements in one round trip, which the extended
//! protocol's parameters cannot do; see `atomic`).
//!
//! Every literal here is safe whatever it holds and whatever the session's
//! settings, by construction rather than by trusting the input:
//!
//! - text is an escape string `E'...'`, whose meaning does not depend on
//!   `standard_conforming_strings`. Inside it `\` and `'` are written `\\` and
//!   `\'`, and every ASCII control character (including NUL) as `\xHH` with
//!   exactly two hex digits, so nothing the value holds can end the literal,
//!   and the query text never holds a raw NUL (which would cut the protocol
//!   message short). Other characters are written as they are: the client
//!   encoding is UTF-8 (sqlx sets it), and no byte of a multi-byte UTF-8
//!   sequence can be `'` or `\`. A NUL is refused by the server, as it is when
//!   bound as a parameter;
//! - bytes are `E'\\x<hex>'::bytea`: hex digits only;
//! - integers are their decimal digits in a quoted string cast to `bigint`
//!   (`'-5'::bigint`: a bare `-5::bigint` would apply the minus after the cast,
//!   which overflows for the smallest `bigint`), `NULL` for none.

use std::fmt::Write as _;

/// A text literal holding exactly `value`.
pub(crate) fn text(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 4);
    out.push_str("E'");
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\x{:02X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// A `bytea` literal holding exactly `bytes`.
pub(crate) fn bytea(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2 + 16);
    out.push_str("E'\\\\x");
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out.push_str("'::bytea");
    out
}

/// A `bigint` literal, or `NULL`.
pub(crate) fn bigint(value: Option<i64>) -> String {
    match value {
        Some(value) => format!("'{value}'::bigint"),
        None => "NULL::bigint".to_owned(),
    }
}

/// A text literal, or `NULL`.
pub(crate) fn opt_text(value: Option<&str>) -> String {
    value.map_or_else(|| "NULL::text".to_owned(), text)
}

/// A `bytea` literal, or `NULL`.
pub(crate) fn opt_bytea(value: Option<&[u8]>) -> String {
    value.map_or_else(|| "NULL::bytea".to_owned(), bytea)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_escapes_what_could_end_the_literal_and_nothing_else() {
        assert_eq!(text("order-42"), "E'order-42'");
        assert_eq!(text("it's"), r"E'it\'s'");
        assert_eq!(text(r"a\b"), r"E'a\\b'");
        assert_eq!(text(r"\'"), r"E'\\\''");
        assert_eq!(text("a\nb\0c\u{7f}"), r"E'a\x0Ab\x00c\x7F'");
        assert_eq!(text("née €"), "E'née €'");
        assert_eq!(text(""), "E''");
    }

    #[test]
    fn text_literals_never_hold_an_unescaped_quote_or_backslash() {
        let all: String = (0u8..=0x7f).map(char::from).chain(['é', '€']).collect();
        let literal = text(&all);
        let body = &literal[2..literal.len() - 1];
        // Walk the body as the server's lexer does: a backslash always takes
        // the next character with it, so a quote can only appear escaped.
        let mut chars = body.chars();
        while let Some(c) = chars.next() {
            assert!(
                !c.is_ascii_control(),
                "raw control character in {literal:?}"
            );
            match c {
                '\\' => assert!(chars.next().is_some(), "dangling backslash"),
                '\'' => panic!("unescaped quote in {literal:?}"),
                _ => {}
            }
        }
    }

    #[test]
    fn bytea_is_hex_digits_only() {
        assert_eq!(bytea(&[]), r"E'\\x'::bytea");
        assert_eq!(bytea(&[0, 0x27, 0x5c, 0xff]), r"E'\\x00275cff'::bytea");
        assert_eq!(opt_bytea(None), "NULL::bytea");
    }

    /// Every literal means exactly the value bound as a parameter: the server
    /// itself compares them.
    #[tokio::test]
    async fn the_server_reads_each_literal_as_the_bound_value() {
        let Some(mut conn) = crate::testing::connect().await else {
            return;
        };
        let ascii: String = (1u8..=0x7f).map(char::from).collect();
        let texts = [
            "",
            "order-42",
            "it's",
            r"back\slash",
            r"\'",
            r"E'\x41'",
            "'; DROP TABLE idem_records; --",
            "$$ $q$ \"quoted\"",
            "line\nbreak\ttab\r",
            "née € 日本 🦀",
            &ascii,
        ];
        for value in texts {
            let sql = format!(
                "SELECT {} = $1 AS same, {} AS echoed",
                text(value),
                text(value)
            );
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(value)
                .fetch_one(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("literal of {value:?}: {e}"));
            let same: bool = sqlx::Row::get(&row, "same");
            let echoed: String = sqlx::Row::get(&row, "echoed");
            assert!(same, "{value:?}");
            assert_eq!(echoed, value);
        }
        let all_bytes: Vec<u8> = (0..=255).collect();
        for value in [&[][..], b"\x00'", &all_bytes] {
            let sql = format!("SELECT {} = $1", bytea(value));
            let same: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(value)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            assert!(same, "{value:?}");
        }
        for value in [Some(i64::MIN), Some(-1), Some(0), Some(i64::MAX), None] {
            let sql = format!("SELECT {} IS NOT DISTINCT FROM $1", bigint(value));
            let same: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(value)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            assert!(same, "{value:?}");
        }
    }

    /// A NUL cannot be stored in text; the literal makes the server refuse it
    /// rather than cut the query short.
    #[tokio::test]
    async fn a_nul_in_text_is_refused_not_truncated() {
        let Some(mut conn) = crate::testing::connect().await else {
            return;
        };
        let sql = format!("SELECT {} AS t, 'after' AS rest", text("a\0b"));
        let refused = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .fetch_all(&mut conn)
            .await;
        assert!(refused.is_err(), "{refused:?}");
        let still_usable: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(still_usable, 1);
    }

    #[test]
    fn numbers_and_nulls() {
        assert_eq!(bigint(Some(i64::MIN)), "'-9223372036854775808'::bigint");
        assert_eq!(bigint(None), "NULL::bigint");
        assert_eq!(opt_text(None), "NULL::text");
        assert_eq!(opt_text(Some("x")), "E'x'");
    }
}
