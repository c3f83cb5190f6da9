//! A record's hash, as `HGETALL` returns it, read back into a [`Record`].

use std::collections::HashMap;

use idem_core::{
    Error, ErrorKind, FencingToken, Fingerprint, IdempotencyKey, Record, RecordState, Scope,
    StoreError, Timestamp,
};

use crate::scripts;

/// The record in `fields` (the hash at `name`); `None` for an empty hash (no record).
pub(crate) fn from_hash(
    name: &str,
    fields: &HashMap<String, Vec<u8>>,
) -> Result<Option<Record>, Error> {
    if fields.is_empty() {
        return Ok(None);
    }
    let field = |what: &str| -> Result<&[u8], Error> {
        fields
            .get(what)
            .map(Vec::as_slice)
            .ok_or_else(|| corrupt(name, &format!("no field {what:?}")))
    };
    let text = |what: &str| -> Result<&str, Error> {
        std::str::from_utf8(field(what)?)
            .map_err(|_| corrupt(name, &format!("field {what:?} is not text")))
    };
    let number = |what: &str| -> Result<i64, Error> {
        text(what)?
            .parse()
            .map_err(|_| corrupt(name, &format!("field {what:?} is not a number")))
    };
    let state: RecordState = text("state")?
        .parse()
        .map_err(|e| corrupt(name, &format!("{e}")))?;
    let lease_until = match text("lease")? {
        "" => None,
        _ => Some(Timestamp(number("lease")?)),
    };
    let outcome = match fields.get("kind") {
        Some(kind) if !kind.is_empty() => Some(scripts::outcome(
            name,
            kind,
            fields.get("body").map_or(&[][..], Vec::as_slice),
            fields.get("meta").map_or(&b"{}"[..], Vec::as_slice),
        )?),
        _ => None,
    };
    Ok(Some(Record {
        scope: Scope::new(text("scope")?).map_err(|e| corrupt(name, &format!("{e}")))?,
        key: IdempotencyKey::new(text("key")?).map_err(|e| corrupt(name, &format!("{e}")))?,
        fingerprint: Fingerprint::from_slice(field("fp")?)
            .ok_or_else(|| corrupt(name, "the fingerprint is not 32 bytes"))?,
        state,
        token: FencingToken::new(number("token")?)
            .ok_or_else(|| corrupt(name, "the token is not positive"))?,
        lease_until,
        outcome,
        created_at: Timestamp(number("created")?),
        updated_at: Timestamp(number("updated")?),
        expires_at: Timestamp(number("expires")?),
    }))
}

fn corrupt(name: &str, what: &str) -> Error {
    StoreError::new(
        ErrorKind::Corrupt,
        format!(
            "the Redis hash {name} is not a record Idem wrote ({what}); delete it, or give the store a key prefix no other program writes under"
        ),
    )
    .into()
}
