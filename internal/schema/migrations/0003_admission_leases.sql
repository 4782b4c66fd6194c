-- Capacity leases: the system limit (max_runs) is divided among the shards
-- so that each shard can judge its starts alone and no interleaving of
-- starts on different shards can exceed the limit (docs/admission.md).
--
-- admission_ledger, used on shard 0 only: for each shard, the capacity ever
-- granted to it and the part of what it gave back that the ledger has
-- taken in. Both only grow. What a shard holds by the ledger's account is
-- granted - returned, and the sum of that over the shards never exceeds
-- max_runs (checked under the ledger's lock, harvest_ledger_lock, whenever
-- capacity is granted).
CREATE TABLE admission_ledger (
    shard    integer PRIMARY KEY CHECK (shard >= 0),
    granted  bigint  NOT NULL DEFAULT 0 CHECK (granted >= 0),
    returned bigint  NOT NULL DEFAULT 0 CHECK (returned >= 0 AND returned <= granted)
);

-- admission_lease, one row on every shard: the part of the ledger's grants
-- this shard has taken in, and the capacity it ever gave back. Both only
-- grow, and a transfer is applied by raising a figure to the other side's
-- (greatest), so that applying one twice or late changes nothing. The
-- shard may hold granted - returned unfinished runs. A grant is written to
-- the ledger before the shard, and a return to the shard before the
-- ledger: a crash between the two steps leaves the ledger counting more
-- than the shard holds, which loses capacity until the next sync, never
-- creates it.
CREATE TABLE admission_lease (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    granted  bigint  NOT NULL DEFAULT 0 CHECK (granted >= 0),
    returned bigint  NOT NULL DEFAULT 0 CHECK (returned >= 0 AND returned <= granted)
);
INSERT INTO admission_lease DEFAULT VALUES;
