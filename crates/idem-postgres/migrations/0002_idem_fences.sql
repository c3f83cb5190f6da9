-- One row per named resource guarded by fencing tokens. Rows are never deleted:
-- releasing a lease only ends it, so every new token is greater than all the
-- tokens ever issued for the resource, across restarts.
CREATE TABLE idem_fences (
    resource    TEXT   NOT NULL PRIMARY KEY,
    token       BIGINT NOT NULL CHECK (token > 0),
    lease_until BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
