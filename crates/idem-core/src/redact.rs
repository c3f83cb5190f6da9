//! [`redact_url`]: a URL made safe to print.
//!
//! Store, broker and webhook URLs carry passwords, and webhook URLs often carry
//! tokens in their query. Every log line, error message and table that shows
//! such a URL goes through this one function, so they all hide the same parts.

/// `text` made safe to print: a password in the user-info becomes `***` (the
/// user name is kept) and everything from the first `?` or `#` after the
/// user-info (query and fragment) is dropped.
///
/// Any scheme is handled the same way (`postgres://`, `amqp://`, `nats://`,
/// `http(s)://`, `sqlite://`, ...). The text is not validated and never
/// normalised: what is kept is kept byte for byte, and text that is not a
/// URL only loses what follows a `?` or `#`.
///
/// The user-info ends at the last `@` before the first `/` after `scheme://`,
/// so a password holding `@`, `?` or `#` is hidden whole. A password holding an
/// unescaped `/` is not recognised as one (no URL parser would read it as a
/// password either); escape it as `%2F`.
///
/// ```
/// use idem_core::redact_url;
///
/// assert_eq!(
///     redact_url("postgres://app:hunter2@db:5432/idem?sslmode=require"),
///     "postgres://app:***@db:5432/idem"
/// );
/// assert_eq!(redact_url("https://hooks.example/in?token=s3cret"), "https://hooks.example/in");
/// assert_eq!(redact_url("sqlite:///var/lib/idem.db"), "sqlite:///var/lib/idem.db");
/// ```
pub fn redact_url(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://").filter(|(s, _)| is_scheme(s)) else {
        return without_query(text).to_owned();
    };
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let user_info = authority
        .rfind('@')
        .map(|at| (&rest[..at], &rest[at + 1..]))
        // A `?` or `#` in the user name means the `@` belongs to the query or
        // the fragment, and there is no user-info.
        .filter(|(info, _)| !user_name(info).contains(['?', '#']));
    match user_info {
        Some((info, after)) => {
            let after = without_query(after);
            match info.split_once(':') {
                Some((user, _password)) => format!("{scheme}://{user}:***@{after}"),
                None => format!("{scheme}://{info}@{after}"),
            }
        }
        None => format!("{scheme}://{}", without_query(rest)),
    }
}

/// A URI scheme: a letter, then letters, digits, `+`, `-` or `.`.
fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// The user name of a user-info: everything before the first `:`.
fn user_name(info: &str) -> &str {
    info.split_once(':').map_or(info, |(user, _)| user)
}

/// `text` up to its first `?` or `#`.
fn without_query(text: &str) -> &str {
    &text[..text.find(['?', '#']).unwrap_or(text.len())]
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn a_password_becomes_stars_and_the_user_stays() {
        for (url, shown) in [
            (
                "postgres://app:hunter2@db:5432/idem",
                "postgres://app:***@db:5432/idem",
            ),
            (
                "postgresql://app:hunter2@db/idem",
                "postgresql://app:***@db/idem",
            ),
            (
                "amqp://guest:guest@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            ("nats://n:pw@h:4222/s", "nats://n:***@h:4222/s"),
            (
                "https://u:p@example.invalid",
                "https://u:***@example.invalid",
            ),
            ("redis://:pw@h:6379", "redis://:***@h:6379"),
            ("amqp://guest:@h/v", "amqp://guest:***@h/v"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn urls_without_a_password_are_kept() {
        for url in [
            "postgres://postgres@127.0.0.1:5432/postgres",
            "postgres://db/idem",
            "nats://127.0.0.1:4222",
            "http://127.0.0.1:8080/hooks/orders",
            "sqlite://idem.db",
            "sqlite:///var/lib/idem.db",
            "amqp://h",
            "amqp://",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }

    #[test]
    fn query_and_fragment_are_cut_off() {
        for (url, shown) in [
            ("http://h/p?token=s3cret", "http://h/p"),
            ("http://h/p#section", "http://h/p"),
            ("http://h?x=1", "http://h"),
            ("http://h#f", "http://h"),
            ("http://h/p?x=a@b:c", "http://h/p"),
            ("http://h?x=a@b", "http://h"),
            ("http://h?x=a:s@b/c", "http://h"),
            ("http://h#a:s@b", "http://h"),
            ("sqlite://idem.db?mode=rwc", "sqlite://idem.db"),
            (
                "postgres://app:hunter2@db/idem?sslmode=require&password=x",
                "postgres://app:***@db/idem",
            ),
            ("amqp://u:p@h:5672/%2f#frag", "amqp://u:***@h:5672/%2f"),
            ("amqp://u:p@h?heartbeat=5", "amqp://u:***@h"),
            (
                "postgres://app@db/idem?sslmode=require",
                "postgres://app@db/idem",
            ),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn the_whole_password_is_hidden_whatever_it_holds() {
        for (url, shown) in [
            ("postgres://u:p@ss@h/db", "postgres://u:***@h/db"),
            ("postgres://u:a@b@c@h:5432/db", "postgres://u:***@h:5432/db"),
            ("postgres://u:pa?ss@h/db?x=1", "postgres://u:***@h/db"),
            ("postgres://u:pa#ss@h/db", "postgres://u:***@h/db"),
            ("postgres://u:p:w@h/db", "postgres://u:***@h/db"),
            ("postgres://u:p%40ss@h/db", "postgres://u:***@h/db"),
        ] {
            let redacted = redact_url(url);
            assert_eq!(redacted, shown, "{url}");
            assert!(!redacted.contains("ss"), "{redacted}");
        }
    }

    #[test]
    fn ipv6_hosts_are_kept() {
        for (url, shown) in [
            (
                "postgres://u:pw@[::1]:5432/db",
                "postgres://u:***@[::1]:5432/db",
            ),
            (
                "http://[2001:db8::1]:8080/p?q",
                "http://[2001:db8::1]:8080/p",
            ),
            ("nats://[::1]:4222", "nats://[::1]:4222"),
            ("amqp://u@[fe80::1%25eth0]/v", "amqp://u@[fe80::1%25eth0]/v"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn text_that_is_not_a_url_only_loses_its_query() {
        for (text, shown) in [
            ("", ""),
            ("idem.db", "idem.db"),
            ("orders", "orders"),
            ("orders?x=1", "orders"),
            ("not a url # at all", "not a url "),
            ("://h/p", "://h/p"),
            ("1a://h/p", "1a://h/p"),
            ("a b://h/p?q", "a b://h/p"),
            ("@", "@"),
            ("x://@", "x://@"),
            ("x://:@", "x://:***@"),
            ("ключ://ü:ß@é?ñ", "ключ://ü:ß@é"),
            ("x://ü:ß@é?ñ", "x://ü:***@é"),
        ] {
            assert_eq!(redact_url(text), shown, "{text:?}");
        }
    }
}
