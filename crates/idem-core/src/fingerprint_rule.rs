//! Fingerprint rules: which parts of a payload a fingerprint covers, so a
//! retry whose body differs only in a field that changes on every attempt (a
//! client timestamp, a trace id, a nonce) is still a retry; and the mark a
//! rule leaves in the fingerprint, so a rule changed during a deploy never
//! turns retries into key-reuse errors. Both are documented on
//! [`FingerprintRule`], the public face of this module.

use std::borrow::Cow;
use std::fmt;

use jsonptr::{Pointer, PointerBuf};
use serde_json::Value;

use crate::fingerprint::Fingerprint;

/// The first four bytes of a fingerprint made under a rule other than the
/// default; the last one is the layout's version.
pub const RULE_MARK: [u8; 4] = [0xf1, 0x9e, 0x71, 0x01];

/// The short id of a rule: the first 4 bytes of a hash of its text
/// ([`FingerprintRule`]'s `Display`), written as 8 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RuleId([u8; 4]);

impl RuleId {
    /// The id's 4 bytes.
    pub fn as_bytes(&self) -> &[u8; 4] {
        &self.0
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RuleId({self})")
    }
}

/// How a fingerprint compares with a stored one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FingerprintMatch {
    /// The same payload, under the same rule.
    Same,
    /// Another payload under the same rule: the key was reused.
    Different,
    /// Made under another rule (the fingerprint rule changed since the
    /// record was written): the two cannot be compared.
    OtherRule,
}

impl Fingerprint {
    /// The id of the rule this fingerprint was made under; `None` for the
    /// default rule (the whole body), and for fingerprints made by hand.
    pub fn rule_id(&self) -> Option<RuleId> {
        let bytes = self.as_bytes();
        (bytes[..4] == RULE_MARK).then(|| RuleId([bytes[4], bytes[5], bytes[6], bytes[7]]))
    }

    /// Compares this fingerprint with a `stored` one: the same, another
    /// payload, or made under another rule.
    ///
    /// ```
    /// use idem_core::{Fingerprint, FingerprintMatch, FingerprintRule};
    /// let amount = FingerprintRule::default().select("json:/amount")?;
    /// let whole = FingerprintRule::default();
    /// let a = amount.fingerprint(br#"{"amount":10,"nonce":1}"#, |_| Vec::new());
    /// let b = amount.fingerprint(br#"{"amount":10,"nonce":2}"#, |_| Vec::new());
    /// let c = amount.fingerprint(br#"{"amount":11,"nonce":1}"#, |_| Vec::new());
    /// let d = whole.fingerprint(br#"{"amount":10,"nonce":1}"#, |_| Vec::new());
    /// assert_eq!(b.compare(&a), FingerprintMatch::Same);
    /// assert_eq!(c.compare(&a), FingerprintMatch::Different);
    /// assert_eq!(d.compare(&a), FingerprintMatch::OtherRule);
    /// # Ok::<(), idem_core::FingerprintRuleError>(())
    /// ```
    pub fn compare(&self, stored: &Fingerprint) -> FingerprintMatch {
        if self == stored {
            FingerprintMatch::Same
        } else if self.rule_id() == stored.rule_id() {
            FingerprintMatch::Different
        } else {
            FingerprintMatch::OtherRule
        }
    }
}

/// A fingerprint rule that cannot be used; the message says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintRuleError {
    /// The list does not start with `json:`.
    #[error(
        "{text:?} does not start with json: (the only kind of field list); write json:/field,/other, such as json:/amount,/currency"
    )]
    UnknownPrefix {
        /// The text as given.
        text: String,
    },
    /// `json:` with no field after it, or an empty item between commas.
    #[error(
        "{text:?} names no field{where_}; write JSON Pointers separated by commas, such as json:/amount,/currency"
    )]
    Empty {
        /// The text as given.
        text: String,
        /// Where the empty item is, if the list is not empty.
        where_: String,
    },
    /// An item that is not a JSON Pointer.
    #[error(
        "{pointer:?} is not a JSON Pointer (RFC 6901): {reason}; write /name, /parent/child or /items/0, with ~1 for a / and ~0 for a ~ inside a name"
    )]
    BadPointer {
        /// The item as given.
        pointer: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Both a selection and a list of ignored fields.
    #[error(
        "a fingerprint rule either selects fields or ignores some, not both: keep the selection (json:/amount,/currency) or the ignored fields, not the two"
    )]
    SelectAndIgnore,
    /// A header name that is not a token (RFC 9110).
    #[error(
        "{name:?} is not a header name; write one such as content-type or x-tenant-id (letters, digits and !#$%&'*+-.^_`|~)"
    )]
    BadHeader {
        /// The name as given.
        name: String,
    },
}

/// What the body contributes to a fingerprint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
enum Body {
    /// The whole body, canonical when it is JSON.
    #[default]
    Whole,
    /// Only these fields (sorted, without repeats).
    Select(Vec<PointerBuf>),
    /// The body less these fields (sorted, without repeats).
    Ignore(Vec<PointerBuf>),
}

/// Which parts of a payload a fingerprint covers: the whole body (the
/// default), selected JSON fields or the body less some, and chosen headers.
///
/// By default a fingerprint covers the whole body (its RFC 8785 canonical form
/// when it is JSON). A rule narrows that to what matters, so a retry whose
/// body differs only in a field that changes on every attempt (a client
/// timestamp, a trace id, a nonce) is still a retry:
///
/// - `json:/amount,/currency,/account` covers only these JSON fields
///   ([`select`](FingerprintRule::select));
/// - `json:/sent_at,/trace_id` given to [`ignore`](FingerprintRule::ignore)
///   covers the body less these fields;
/// - [`header`](FingerprintRule::header) adds a header's values (an HTTP
///   request's, a message's).
///
/// Fields are JSON Pointers (RFC 6901): `/amount`, `/payer/account`,
/// `/items/0/sku`, with `~1` for a `/` and `~0` for a `~` inside a name. The
/// order of the list does not matter, nor does the order of fields in the
/// body. A selected field that is missing is hashed as absent, which differs
/// from a field that is `null`. A body that is not JSON is covered whole under
/// a `json:` rule (there are no fields to pick). Ignoring an array element
/// (`/tags/0`) blanks it: the other elements keep their positions.
///
/// # The rule is part of the fingerprint
///
/// A fingerprint made under a rule other than the default starts with a
/// 4-byte mark and the rule's 4-byte id (a hash of the rule's text, see
/// [`RuleId`]), followed by 24 bytes of the hash. A default fingerprint is
/// the 32-byte hash, as it always was. So a record says which rule it was
/// fingerprinted under, and [`Fingerprint::compare`] tells a different
/// payload (same rule, other hash: key reuse) from a different rule (the
/// hashes cannot be compared). The protocol answers a record of another rule
/// as if the fingerprints matched — a retry is replayed, not refused — and
/// logs and counts it ([`observe::FINGERPRINT_RULE_CHANGED_TOTAL`](crate::observe::FINGERPRINT_RULE_CHANGED_TOTAL)):
/// changing the rule during a deploy never turns the retries of requests made
/// just before it into key-reuse errors.
///
/// ```
/// use idem_core::FingerprintRule;
/// let rule = FingerprintRule::default()
///     .select("json:/currency, /amount")?
///     .header("Content-Type")?;
/// assert_eq!(rule.to_string(), "json:/amount,/currency header:content-type");
/// let a = rule.fingerprint(br#"{"amount":10,"currency":"EUR","sent_at":1}"#, |_| vec![b"application/json".to_vec()]);
/// let b = rule.fingerprint(br#"{"sent_at":2,"currency":"EUR","amount":10}"#, |_| vec![b"application/json".to_vec()]);
/// assert_eq!(a, b);
/// # Ok::<(), idem_core::FingerprintRuleError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FingerprintRule {
    body: Body,
    /// Lower-case names, sorted, without repeats.
    headers: Vec<String>,
}

impl FingerprintRule {
    /// Covers only the fields of `list` (`json:/amount,/currency`).
    pub fn select(mut self, list: &str) -> Result<Self, FingerprintRuleError> {
        let pointers = parse_list(list)?;
        self.body = match self.body {
            Body::Ignore(_) => return Err(FingerprintRuleError::SelectAndIgnore),
            Body::Select(had) => Body::Select(sorted(had, pointers)),
            Body::Whole => Body::Select(sorted(Vec::new(), pointers)),
        };
        Ok(self)
    }

    /// Covers the body less the fields of `list` (`json:/sent_at,/trace_id`).
    pub fn ignore(mut self, list: &str) -> Result<Self, FingerprintRuleError> {
        let pointers = parse_list(list)?;
        self.body = match self.body {
            Body::Select(_) => return Err(FingerprintRuleError::SelectAndIgnore),
            Body::Ignore(had) => Body::Ignore(sorted(had, pointers)),
            Body::Whole => Body::Ignore(sorted(Vec::new(), pointers)),
        };
        Ok(self)
    }

    /// Also covers every value of the header `name` (matched without regard
    /// to case). A missing header differs from one with an empty value.
    pub fn header(mut self, name: &str) -> Result<Self, FingerprintRuleError> {
        let name = name.trim();
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || !name.bytes().all(token) {
            return Err(FingerprintRuleError::BadHeader {
                name: name.to_owned(),
            });
        }
        let name = name.to_ascii_lowercase();
        if let Err(at) = self.headers.binary_search(&name) {
            self.headers.insert(at, name);
        }
        Ok(self)
    }

    /// The headers covered, in lower case.
    pub fn headers(&self) -> &[String] {
        &self.headers
    }

    /// The selected fields as a list (`json:/amount,/currency`), if the rule
    /// selects fields.
    pub fn selected(&self) -> Option<String> {
        match &self.body {
            Body::Select(list) => Some(list_text(list)),
            _ => None,
        }
    }

    /// The ignored fields as a list (`json:/sent_at`), if the rule ignores some.
    pub fn ignored(&self) -> Option<String> {
        match &self.body {
            Body::Ignore(list) => Some(list_text(list)),
            _ => None,
        }
    }

    /// Whether this is the default rule: the whole body, no header. Its
    /// fingerprints carry no rule id and are the ones made before rules
    /// existed.
    pub fn is_whole_body(&self) -> bool {
        self.body == Body::Whole && self.headers.is_empty()
    }

    /// The rule's id, carried by its fingerprints; `None` for the default rule.
    pub fn id(&self) -> Option<RuleId> {
        if self.is_whole_body() {
            return None;
        }
        let mut hasher = blake3::Hasher::new_derive_key("idem 2026 fingerprint rule id");
        hasher.update(self.to_string().as_bytes());
        let hash = hasher.finalize();
        let bytes = hash.as_bytes();
        Some(RuleId([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// The hash of what the rule covers of `body` and of the headers
    /// (`header_values` gives every value of a header, by its lower-case
    /// name). Under the default rule it is
    /// [`Fingerprint::of_json_or_bytes`]`(body)`. Callers that frame it with
    /// more parts (method, route) then [`seal`](Self::seal) the result.
    pub fn digest(&self, body: &[u8], header_values: impl Fn(&str) -> Vec<Vec<u8>>) -> Fingerprint {
        if self.is_whole_body() {
            return Fingerprint::of_json_or_bytes(body);
        }
        let mut hasher = blake3::Hasher::new_derive_key("idem 2026 fingerprint under a rule");
        let mut part = |bytes: &[u8]| {
            hasher.update(&(bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        let json = match &self.body {
            Body::Whole => None,
            Body::Select(_) | Body::Ignore(_) => serde_json::from_slice::<Value>(body).ok(),
        };
        match (&self.body, json) {
            (Body::Select(fields), Some(value)) => {
                part(b"select");
                for field in fields {
                    part(field.as_str().as_bytes());
                    match field.resolve(&value) {
                        Ok(found) => {
                            part(b"value");
                            part(&canonical(found));
                        }
                        Err(_) => part(b"absent"),
                    }
                }
            }
            (Body::Ignore(fields), Some(mut value)) => {
                part(b"ignore");
                for field in fields {
                    blank(&mut value, field);
                }
                part(&canonical(&value));
            }
            // The whole body, or a body that is not JSON under a json: rule.
            _ => {
                part(b"whole");
                part(Fingerprint::of_json_or_bytes(body).as_bytes());
            }
        }
        for name in &self.headers {
            part(b"header");
            part(name.as_bytes());
            let values = header_values(name);
            part(&(values.len() as u64).to_le_bytes());
            for value in &values {
                part(value);
            }
        }
        Fingerprint::from_bytes(*hasher.finalize().as_bytes())
    }

    /// Marks `fingerprint` as made under this rule: the mark, the rule's id,
    /// then 24 bytes of the hash. The default rule leaves it as it is.
    pub fn seal(&self, fingerprint: Fingerprint) -> Fingerprint {
        let Some(id) = self.id() else {
            return fingerprint;
        };
        let mut bytes = [0u8; 32];
        bytes[..4].copy_from_slice(&RULE_MARK);
        bytes[4..8].copy_from_slice(id.as_bytes());
        bytes[8..].copy_from_slice(&fingerprint.as_bytes()[..24]);
        Fingerprint::from_bytes(bytes)
    }

    /// The sealed [`digest`](Self::digest) of a body and headers: a message's
    /// fingerprint.
    pub fn fingerprint(
        &self,
        body: &[u8],
        header_values: impl Fn(&str) -> Vec<Vec<u8>>,
    ) -> Fingerprint {
        self.seal(self.digest(body, header_values))
    }
}

/// The rule's text, from which its id is hashed: `body` for the default,
/// else the fields (`json:/a,/b`, or `ignore json:/a`) and the headers
/// (`header:NAME`), separated by spaces.
impl fmt::Display for FingerprintRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.body {
            Body::Whole => f.write_str("body")?,
            Body::Select(list) => f.write_str(&list_text(list))?,
            Body::Ignore(list) => write!(f, "ignore {}", list_text(list))?,
        }
        for name in &self.headers {
            write!(f, " header:{name}")?;
        }
        Ok(())
    }
}

fn list_text(list: &[PointerBuf]) -> String {
    let fields: Vec<&str> = list.iter().map(|p| p.as_str()).collect();
    format!("json:{}", fields.join(","))
}

/// `had` and `more`, sorted, without repeats.
fn sorted(mut had: Vec<PointerBuf>, more: Vec<PointerBuf>) -> Vec<PointerBuf> {
    had.extend(more);
    had.sort();
    had.dedup();
    had
}

/// `json:/a,/b` as pointers.
fn parse_list(text: &str) -> Result<Vec<PointerBuf>, FingerprintRuleError> {
    let trimmed = text.trim();
    let Some(list) = trimmed
        .get(..5)
        .filter(|prefix| prefix.eq_ignore_ascii_case("json:"))
        .map(|_| &trimmed[5..])
    else {
        return Err(FingerprintRuleError::UnknownPrefix {
            text: text.to_owned(),
        });
    };
    if list.trim().is_empty() {
        return Err(FingerprintRuleError::Empty {
            text: text.to_owned(),
            where_: String::new(),
        });
    }
    let mut pointers = Vec::new();
    for (i, item) in list.split(',').map(str::trim).enumerate() {
        if item.is_empty() {
            return Err(FingerprintRuleError::Empty {
                text: text.to_owned(),
                where_: format!(" in item {}", i + 1),
            });
        }
        let pointer = Pointer::parse(item).map_err(|error| {
            let reason: Cow<'static, str> = match error {
                jsonptr::ParseError::NoLeadingSlash => "it does not start with /".into(),
                jsonptr::ParseError::InvalidEncoding { offset, .. } => format!(
                    "a ~ that is not ~0 or ~1 in the part starting at character {}",
                    offset + 1
                )
                .into(),
            };
            FingerprintRuleError::BadPointer {
                pointer: item.to_owned(),
                reason: reason.into_owned(),
            }
        })?;
        pointers.push(pointer.to_buf());
    }
    Ok(pointers)
}

/// RFC 8785 canonical JSON of a value that came from JSON text.
fn canonical(value: &Value) -> Vec<u8> {
    // A `Value` parsed from JSON text always serializes (its numbers are
    // finite), so the fallback is never taken; it keeps the hash total.
    serde_jcs::to_vec(value).unwrap_or_else(|_| value.to_string().into_bytes())
}

/// Leaves out the value at `field`: an object member is removed, an array
/// element is set to `null` (the others keep their positions). A field that
/// is not there changes nothing.
fn blank(value: &mut Value, field: &Pointer) {
    let Some((parent, last)) = field.split_back() else {
        return;
    };
    let Ok(parent) = parent.resolve_mut(value) else {
        return;
    };
    match parent {
        Value::Object(members) => {
            members.remove(last.decoded().as_ref());
        }
        Value::Array(items) => {
            if let Ok(jsonptr::index::Index::Num(i)) = last.to_index()
                && let Some(item) = items.get_mut(i)
            {
                *item = Value::Null;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Vec<Vec<u8>> {
        Vec::new()
    }

    fn rule(select: &str) -> FingerprintRule {
        FingerprintRule::default().select(select).unwrap()
    }

    #[test]
    fn selected_fields_ignore_order_and_the_rest_of_the_body() {
        let r = rule("json:/amount,/currency");
        let a = r.fingerprint(br#"{"amount":10,"currency":"EUR","sent_at":1}"#, none);
        let b = r.fingerprint(br#"{ "currency":"EUR", "sent_at":2, "amount":10.0 }"#, none);
        let c = r.fingerprint(br#"{"amount":11,"currency":"EUR","sent_at":1}"#, none);
        assert_eq!(a, b);
        assert_ne!(a, c);
        // The list's order is not part of the rule.
        assert_eq!(rule("json:/currency,/amount,/amount"), r);
        assert_eq!(
            rule("json:/currency,/amount").fingerprint(br#"{"amount":10,"currency":"EUR"}"#, none),
            a
        );
    }

    #[test]
    fn an_absent_field_differs_from_null_and_from_a_value() {
        let r = rule("json:/account");
        let absent = r.fingerprint(br#"{"amount":1}"#, none);
        let null = r.fingerprint(br#"{"amount":1,"account":null}"#, none);
        let set = r.fingerprint(br#"{"amount":1,"account":"a"}"#, none);
        assert_ne!(absent, null);
        assert_ne!(absent, set);
        assert_ne!(null, set);
        assert_eq!(absent, r.fingerprint(br#"{"amount":2}"#, none));
    }

    #[test]
    fn ignored_fields_are_left_out_of_nested_objects_and_arrays() {
        let r = FingerprintRule::default()
            .ignore("json:/sent_at,/meta/trace_id,/tags/0")
            .unwrap();
        let a = r.fingerprint(
            br#"{"amount":1,"sent_at":1,"meta":{"trace_id":"x","k":1},"tags":["a","b"]}"#,
            none,
        );
        let b = r.fingerprint(
            br#"{"meta":{"k":1,"trace_id":"y"},"tags":["z","b"],"amount":1}"#,
            none,
        );
        let c = r.fingerprint(
            br#"{"amount":1,"meta":{"k":2},"tags":["a","b"],"sent_at":1}"#,
            none,
        );
        let d = r.fingerprint(br#"{"amount":1,"meta":{"k":1},"tags":["a","c"]}"#, none);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn a_body_that_is_not_json_is_covered_whole() {
        let r = rule("json:/amount");
        assert_eq!(
            r.fingerprint(b"amount=10", none),
            r.fingerprint(b"amount=10", none)
        );
        assert_ne!(
            r.fingerprint(b"amount=10", none),
            r.fingerprint(b"amount=11", none)
        );
        assert_ne!(r.fingerprint(b"", none), r.fingerprint(b"x", none));
    }

    #[test]
    fn headers_count_by_name_without_case_and_missing_differs_from_empty() {
        let r = FingerprintRule::default().header("X-Tenant").unwrap();
        assert_eq!(r.headers(), ["x-tenant"]);
        let with = |v: &'static [u8]| {
            move |name: &str| {
                assert_eq!(name, "x-tenant");
                vec![v.to_vec()]
            }
        };
        let body = br#"{"a":1}"#;
        assert_eq!(
            r.fingerprint(body, with(b"t1")),
            r.fingerprint(body, with(b"t1"))
        );
        assert_ne!(
            r.fingerprint(body, with(b"t1")),
            r.fingerprint(body, with(b"t2"))
        );
        assert_ne!(r.fingerprint(body, with(b"")), r.fingerprint(body, none));
        // The whole body is still covered.
        assert_ne!(
            r.fingerprint(body, with(b"t1")),
            r.fingerprint(br#"{"a":2}"#, with(b"t1"))
        );
    }

    #[test]
    fn the_default_rule_makes_the_fingerprints_made_before_rules() {
        let whole = FingerprintRule::default();
        assert!(whole.is_whole_body());
        assert_eq!(whole.id(), None);
        assert_eq!(whole.to_string(), "body");
        let body = br#"{"b":1,"a":2}"#;
        assert_eq!(
            whole.fingerprint(body, none),
            Fingerprint::of_json_or_bytes(body)
        );
        assert_eq!(whole.fingerprint(body, none).rule_id(), None);
    }

    #[test]
    fn fingerprints_carry_their_rule_and_compare_by_it() {
        let amount = rule("json:/amount");
        let both = rule("json:/amount,/currency");
        let body = br#"{"amount":1,"currency":"EUR"}"#;
        let a = amount.fingerprint(body, none);
        assert_eq!(a.rule_id(), amount.id());
        assert_eq!(&a.as_bytes()[..4], &RULE_MARK);
        assert_ne!(amount.id(), both.id());
        assert_eq!(
            both.fingerprint(body, none).compare(&a),
            FingerprintMatch::OtherRule
        );
        let whole = Fingerprint::of_json_or_bytes(body);
        assert_eq!(whole.compare(&a), FingerprintMatch::OtherRule);
        assert_eq!(a.compare(&whole), FingerprintMatch::OtherRule);
        assert_eq!(
            Fingerprint::of_bytes(b"x").compare(&Fingerprint::of_bytes(b"y")),
            FingerprintMatch::Different
        );
        assert_eq!(
            amount.fingerprint(br#"{"amount":2}"#, none).compare(&a),
            FingerprintMatch::Different
        );
        // Ignoring a field and selecting it are different rules.
        assert_ne!(
            FingerprintRule::default()
                .ignore("json:/amount")
                .unwrap()
                .id(),
            amount.id()
        );
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        let error = |text: &str| {
            FingerprintRule::default()
                .select(text)
                .unwrap_err()
                .to_string()
        };
        assert!(error("/amount").contains("does not start with json:"));
        assert!(error("xml:/amount").contains("does not start with json:"));
        assert!(error("json:").contains("names no field"));
        assert!(error("json: ").contains("names no field"));
        assert!(error("json:/a,,/b").contains("names no field in item 2"));
        let e = error("json:amount");
        assert!(
            e.contains("\"amount\" is not a JSON Pointer") && e.contains("does not start with /"),
            "{e}"
        );
        let e = error("json:/a~2b");
        assert!(e.contains("~0 or ~1"), "{e}");
        assert_eq!(
            FingerprintRule::default()
                .select("json:/a")
                .unwrap()
                .ignore("json:/b")
                .unwrap_err(),
            FingerprintRuleError::SelectAndIgnore
        );
        assert!(matches!(
            FingerprintRule::default().header("bad header"),
            Err(FingerprintRuleError::BadHeader { .. })
        ));
        assert!(matches!(
            FingerprintRule::default().header(""),
            Err(FingerprintRuleError::BadHeader { .. })
        ));
        // Escapes are RFC 6901's: ~1 is a slash inside a name.
        let r = rule("JSON:/a~1b");
        let a = r.fingerprint(br#"{"a/b":1}"#, none);
        assert_ne!(a, r.fingerprint(br#"{"a/b":2}"#, none));
        assert_eq!(a, r.fingerprint(br#"{"a/b":1,"c":3}"#, none));
    }
}
