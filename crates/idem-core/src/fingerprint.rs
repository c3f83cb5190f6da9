//! Fingerprints: a hash of what a request or message asked for.
//!
//! The same key arriving with a different fingerprint is the caller's mistake (a
//! key reused for another operation), not a retry, and is refused with
//! [`KeyReuse`](crate::Error::KeyReuse). JSON payloads are hashed in their RFC 8785
//! canonical form, so field order and number spelling do not make a retry look
//! like a new request. The hash is BLAKE3, 32 bytes.

use std::fmt;

use serde::Serialize;

/// A 32-byte BLAKE3 hash of a canonical payload.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// A payload could not be put in canonical JSON form.
#[derive(Debug, thiserror::Error)]
#[error("payload cannot be written as canonical JSON (RFC 8785): {0}")]
pub struct FingerprintError(#[source] serde_json::Error);

impl Fingerprint {
    /// Hashes raw bytes as they are.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// Hashes a value's RFC 8785 canonical JSON.
    ///
    /// ```
    /// use idem_core::Fingerprint;
    /// let a: serde_json::Value = serde_json::from_str(r#"{"amount": 10, "to": "acc-1"}"#).unwrap();
    /// let b: serde_json::Value = serde_json::from_str(r#"{ "to":"acc-1","amount":10.0 }"#).unwrap();
    /// assert_eq!(Fingerprint::of_json(&a).unwrap(), Fingerprint::of_json(&b).unwrap());
    /// ```
    pub fn of_json<T: Serialize + ?Sized>(value: &T) -> Result<Self, FingerprintError> {
        let canonical = serde_jcs::to_vec(value).map_err(FingerprintError)?;
        Ok(Self::of_bytes(&canonical))
    }

    /// Hashes JSON text after parsing and canonicalizing it; text that is not JSON
    /// is hashed as raw bytes.
    pub fn of_json_or_bytes(body: &[u8]) -> Self {
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(value) => Self::of_json(&value).unwrap_or_else(|_| Self::of_bytes(body)),
            Err(_) => Self::of_bytes(body),
        }
    }

    /// Hashes several parts with unambiguous framing (each part is length-prefixed),
    /// for example method, route and body.
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut hasher = blake3::Hasher::new();
        for part in parts {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        Self(*hasher.finalize().as_bytes())
    }

    /// Wraps stored bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Reads a fingerprint back from a stored byte slice; `None` if it is not 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, for people and logs.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_ignores_order_and_spacing_but_not_values() {
        let a = Fingerprint::of_json_or_bytes(br#"{"b":1,"a":[1,2]}"#);
        let b = Fingerprint::of_json_or_bytes(b"{ \"a\" : [1,2], \"b\" : 1 }");
        let c = Fingerprint::of_json_or_bytes(br#"{"b":2,"a":[1,2]}"#);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn non_json_is_hashed_raw_and_parts_are_framed() {
        assert_eq!(
            Fingerprint::of_json_or_bytes(b"not json"),
            Fingerprint::of_bytes(b"not json")
        );
        let ab_c = Fingerprint::of_parts([&b"ab"[..], b"c"]);
        let a_bc = Fingerprint::of_parts([&b"a"[..], b"bc"]);
        assert_ne!(ab_c, a_bc);
        let fp = Fingerprint::of_bytes(b"x");
        assert_eq!(Fingerprint::from_slice(fp.as_bytes()), Some(fp));
        assert_eq!(fp.to_hex().len(), 64);
    }
}
