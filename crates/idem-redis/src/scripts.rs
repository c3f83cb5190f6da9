//! The Lua scripts: every change of a record is one of them, so its read and
//! its write are one step on the server.
//!
//! The claim script carries out the protocol table of
//! [`idem_core::decide`] on the record it finds, with the application's time
//! and settings as arguments, and writes what [`idem_core::Plan`] says a
//! claim writes: the record's window (`created`, `expires`) is kept inside
//! the window and opened anew past it; a new window's first token is the
//! larger of the next token and [`FencingToken::first_at`] its start, which
//! the caller computes and passes in. Tokens stay below 2^53 until the year
//! 2248, so Lua's numbers hold them exactly; they are written with `%.0f`,
//! never in exponent form.
//!
//! Hash fields: `scope`, `key`, `fp` (the 32 fingerprint bytes), `state`,
//! `token`, `lease` (empty once released or settled), `kind`, `body`,
//! `meta` (outcome), `created`, `updated`, `expires`.

use std::sync::LazyLock;
use std::time::Duration;

use idem_core::{
    Error, ErrorKind, FencingToken, Fingerprint, IdempotencyKey, Outcome, OutcomeKind, RULE_MARK,
    RecordState, Scope, Settings, StoreError, Timestamp,
};
use redis::Script;

/// Claims a key, or answers why not.
///
/// KEYS: the record. ARGV: scope, key, fingerprint, now, the first token of a
/// window starting now, lease, retention, longest retry-after (ms), the mark
/// of a fingerprint made under a rule ([`idem_core::RULE_MARK`]), the
/// tombstone grace period (ms, 0 for none), then what a new key's record
/// holds, worked out by the caller: the lease end, the window's end and the
/// record's time to live (retention and grace period, ms).
///
/// A key with no record (the common case) costs `HMGET`, `HSET` and
/// `PEXPIRE`, with the caller's values written as they come: no number is
/// formatted and nothing is deleted. Any other record goes through the
/// protocol table below, which deletes the record before writing it anew.
///
/// With a grace period, a record outlives its window by that much (Redis
/// expires it then) and stands as its own tombstone: a claim of its key in
/// that time is refused as late (`expired` and the window's end), or as key
/// reuse for another payload.
///
/// A stored fingerprint of another rule (its mark and rule id differ from the
/// request's) is taken as the same, as [`idem_core::decide`] does; the answer
/// then ends with `other_rule` and the stored fingerprint.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local f = redis.call('HMGET', KEYS[1], 'fp', 'state', 'token', 'lease', 'kind', 'body', 'meta', 'created', 'expires')
if not (f[1] or f[2] or f[3] or f[4] or f[5] or f[6] or f[7] or f[8] or f[9]) then
  redis.call('HSET', KEYS[1], 'scope', ARGV[1], 'key', ARGV[2], 'fp', ARGV[3], 'state', 'in_flight',
    'token', ARGV[5], 'lease', ARGV[11], 'created', ARGV[4], 'updated', ARGV[4], 'expires', ARGV[12])
  redis.call('PEXPIRE', KEYS[1], ARGV[13])
  return {'claimed', ARGV[5], ARGV[11], '0', ARGV[12]}
end
local function rule_of(fp)
  if string.len(fp) == 32 and string.sub(fp, 1, 4) == ARGV[9] then
    return string.sub(fp, 5, 8)
  end
  return ''
end
local other_rule = nil
local function answer(reply)
  if other_rule then
    table.insert(reply, 'other_rule')
    table.insert(reply, f[1])
  end
  return reply
end
local now = tonumber(ARGV[4])
local token = tonumber(ARGV[5])
local took_over = '0'
local created = now
local expires = now + tonumber(ARGV[7])
if f[2] then
  if not f[3] or not f[9] then
    return {'corrupt', 'no token or expiry'}
  end
  local stored = tonumber(f[3])
  local grace = tonumber(ARGV[10])
  if tonumber(f[9]) <= now and now < tonumber(f[9]) + grace then
    if f[1] ~= ARGV[3] and rule_of(f[1] or '') == rule_of(ARGV[3]) then
      return {'key_reuse'}
    end
    return {'expired', f[9]}
  elseif tonumber(f[9]) <= now then
    token = math.max(stored + 1, token)
  elseif f[1] ~= ARGV[3] and rule_of(f[1] or '') == rule_of(ARGV[3]) then
    return {'key_reuse'}
  elseif f[2] ~= 'in_flight' then
    other_rule = f[1] ~= ARGV[3]
    if not f[5] then
      return {'corrupt', 'a settled record without an outcome'}
    end
    return answer({'replay', f[5], f[6] or '', f[7] or '{}', f[9]})
  else
    other_rule = f[1] ~= ARGV[3]
    if f[4] and f[4] ~= '' then
      local lease_until = tonumber(f[4])
      if lease_until > now then
        return answer({'in_flight', string.format('%.0f', math.min(lease_until - now, tonumber(ARGV[8])))})
      end
      took_over = '1'
    end
    token = stored + 1
    created = tonumber(f[8])
    expires = tonumber(f[9])
  end
end
local lease_until = now + tonumber(ARGV[6])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'scope', ARGV[1], 'key', ARGV[2], 'fp', ARGV[3], 'state', 'in_flight',
  'token', string.format('%.0f', token), 'lease', string.format('%.0f', lease_until),
  'created', string.format('%.0f', created), 'updated', ARGV[4],
  'expires', string.format('%.0f', expires))
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', math.max(expires + tonumber(ARGV[10]) - now, 1)))
return answer({'claimed', string.format('%.0f', token), string.format('%.0f', lease_until), took_over,
  string.format('%.0f', expires)})
",
    )
});

/// Changes a claim if it is still held: in flight with the caller's token.
///
/// KEYS: the record. ARGV: token, now, then either `lease` and the new lease
/// end (empty to release), or `settle`, the state, kind, body and meta.
static CHANGE_HELD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local f = redis.call('HMGET', KEYS[1], 'state', 'token')
if f[1] ~= 'in_flight' or f[2] ~= ARGV[1] then
  return {'fenced', f[2] or ''}
end
if ARGV[3] == 'lease' then
  redis.call('HSET', KEYS[1], 'lease', ARGV[4], 'updated', ARGV[2])
else
  redis.call('HSET', KEYS[1], 'state', ARGV[4], 'kind', ARGV[5], 'body', ARGV[6], 'meta', ARGV[7],
    'lease', '', 'updated', ARGV[2])
end
return {'held'}
",
    )
});

/// Deletes a record if it is past retention (and its tombstone grace period)
/// by the application's clock.
///
/// KEYS: the record. ARGV: now less the grace period.
static SWEEP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local expires = redis.call('HGET', KEYS[1], 'expires')
if expires and tonumber(expires) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
",
    )
});

/// What the claim script found and did.
#[derive(Debug)]
pub(crate) enum ClaimAnswer {
    Claimed {
        token: FencingToken,
        lease_until: Timestamp,
        took_over: bool,
        expires_at: Timestamp,
    },
    Replay(Outcome, Timestamp),
    Expired(Timestamp),
    KeyReuse,
    InFlight {
        retry_after: Duration,
    },
}

/// The arguments of one claim.
pub(crate) struct ClaimArgs<'a> {
    pub(crate) scope: &'a Scope,
    pub(crate) key: &'a IdempotencyKey,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) now: Timestamp,
    pub(crate) settings: &'a Settings,
}

/// A change to a held claim.
pub(crate) enum HeldChange<'a> {
    /// A new lease end (`None`: released).
    Lease(Option<Timestamp>),
    /// The outcome that settles the record.
    Settle(&'a Outcome),
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn corrupt(record: &str, what: &str) -> Error {
    StoreError::new(
        ErrorKind::Corrupt,
        format!(
            "the Redis record {record} is not one Idem wrote ({what}); delete it (a new claim then starts the key over) or check what else writes under this key prefix"
        ),
    )
    .into()
}

fn text(field: &[u8]) -> &str {
    std::str::from_utf8(field).unwrap_or("")
}

fn number(record: &str, field: &[u8], what: &str) -> Result<i64, Error> {
    text(field)
        .parse()
        .map_err(|_| corrupt(record, &format!("{what} {:?} is not a number", text(field))))
}

pub(crate) fn claim_invocation(
    record: &str,
    args: &ClaimArgs<'_>,
) -> redis::ScriptInvocation<'static> {
    let lease = millis(args.settings.lease);
    let retention = millis(args.settings.retention);
    let grace = args.settings.tombstones.map_or(0, millis);
    let mut invocation = CLAIM.key(record);
    invocation
        .arg(args.scope.as_str())
        .arg(args.key.as_str())
        .arg(args.fingerprint.as_bytes().as_slice())
        .arg(args.now.0)
        .arg(FencingToken::first_at(args.now).get())
        .arg(lease)
        .arg(retention)
        .arg(millis(args.settings.in_flight_retry_after))
        .arg(RULE_MARK.as_slice())
        .arg(grace)
        .arg(args.now.0.saturating_add(lease))
        .arg(args.now.0.saturating_add(retention))
        .arg(retention.saturating_add(grace).max(1));
    invocation
}

/// Reads the claim script's answer, and the stored fingerprint when it was
/// made under another rule than the request's.
pub(crate) fn claim_answer(
    record: &str,
    reply: Vec<Vec<u8>>,
) -> Result<(ClaimAnswer, Option<Fingerprint>), Error> {
    let fields: Vec<&[u8]> = reply.iter().map(Vec::as_slice).collect();
    let (fields, other_rule) = match fields.as_slice() {
        [rest @ .., b"other_rule", stored] => (
            rest,
            Some(
                Fingerprint::from_slice(stored)
                    .ok_or_else(|| corrupt(record, "a fingerprint that is not 32 bytes"))?,
            ),
        ),
        all => (all, None),
    };
    let answer = match fields {
        [b"claimed", token, lease_until, took_over, expires] => Ok(ClaimAnswer::Claimed {
            token: FencingToken::new(number(record, token, "token")?)
                .ok_or_else(|| corrupt(record, "token is not positive"))?,
            lease_until: Timestamp(number(record, lease_until, "lease end")?),
            took_over: *took_over == b"1",
            expires_at: Timestamp(number(record, expires, "expiry")?),
        }),
        [b"replay", kind, body, meta, expires] => Ok(ClaimAnswer::Replay(
            outcome(record, kind, body, meta)?,
            Timestamp(number(record, expires, "expiry")?),
        )),
        [b"expired", expires] => Ok(ClaimAnswer::Expired(Timestamp(number(
            record, expires, "expiry",
        )?))),
        [b"key_reuse"] => Ok(ClaimAnswer::KeyReuse),
        [b"in_flight", retry_after] => Ok(ClaimAnswer::InFlight {
            retry_after: Duration::from_millis(
                u64::try_from(number(record, retry_after, "retry-after")?).unwrap_or(0),
            ),
        }),
        [b"corrupt", what] => Err(corrupt(record, text(what))),
        _ => Err(corrupt(
            record,
            "the claim script answered in an unknown form",
        )),
    };
    answer.map(|answer| (answer, other_rule))
}

/// The outcome stored in `kind`, `body` and `meta`.
pub(crate) fn outcome(
    record: &str,
    kind: &[u8],
    body: &[u8],
    meta: &[u8],
) -> Result<Outcome, Error> {
    let kind: OutcomeKind = text(kind)
        .parse()
        .map_err(|e| corrupt(record, &format!("{e}")))?;
    let meta = Outcome::parse_meta(text(meta)).map_err(|e| {
        corrupt(
            record,
            &format!("outcome metadata is not a JSON string map: {e}"),
        )
    })?;
    Ok(Outcome {
        kind,
        body: body.to_vec(),
        meta,
    })
}

pub(crate) fn change_invocation(
    record: &str,
    token: FencingToken,
    now: Timestamp,
    change: &HeldChange<'_>,
) -> redis::ScriptInvocation<'static> {
    let mut invocation = CHANGE_HELD.key(record);
    invocation.arg(token.get()).arg(now.0);
    match change {
        HeldChange::Lease(until) => {
            invocation
                .arg("lease")
                .arg(until.map(|t| t.0.to_string()).unwrap_or_default());
        }
        HeldChange::Settle(outcome) => {
            invocation
                .arg("settle")
                .arg(RecordState::settled_by(outcome.kind).as_str())
                .arg(outcome.kind.as_str())
                .arg(outcome.body.as_slice())
                .arg(outcome.meta_json());
        }
    }
    invocation
}

/// Reads the change script's answer: `Ok(None)` when the claim was held and
/// changed, `Ok(Some(current))` when it was not (fenced; the record's token
/// if there is a record).
pub(crate) fn change_answer(
    record: &str,
    reply: Vec<Vec<u8>>,
) -> Result<Option<Option<FencingToken>>, Error> {
    let fields: Vec<&[u8]> = reply.iter().map(Vec::as_slice).collect();
    match fields.as_slice() {
        [b"held"] => Ok(None),
        [b"fenced", b""] => Ok(Some(None)),
        [b"fenced", token] => Ok(Some(FencingToken::new(number(record, token, "token")?))),
        _ => Err(corrupt(
            record,
            "the change script answered in an unknown form",
        )),
    }
}

pub(crate) fn sweep_invocation(record: &str, now: Timestamp) -> redis::ScriptInvocation<'static> {
    let mut invocation = SWEEP.key(record);
    invocation.arg(now.0);
    invocation
}
