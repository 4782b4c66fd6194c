-- Write a group of starts in one statement, deciding admission for each new
-- run inside it (runstore's Committer; docs/api.md, "How a start is
-- written"). Item i of the arrays is one start, in the order the starts are
-- decided and written; each (tenant, id) is sent once.
--
-- Under the shard's admission lock, which every transaction that adds runs
-- to the shard takes first (harvest_shard_admission_lock), the group locks
-- its tenants' count rows in byte order (COLLATE "C", creating missing ones
-- at zero) and reads, with them, what each decision needs: each tenant's
-- count (with its runs still on an old home, tenant_away), the shard's
-- count (harvest_shard_running) and its capacity lease. Then, start by
-- start, in order:
--   'moved'    its tenant moved away (tenant_fences): moved_to is the shard
--              it went to, nothing is written for it;
--   'existing' its id exists: the caller answers it from the stored run;
--   'skipped'  p_skip[i]: the caller's own admission refused it (a Go hook,
--              asked about the group as first written);
--   'refused'  the rule refused it (reason: system_limit, tenant_limit,
--              scheduled_limit, or closed when p_closed says every new run
--              is refused);
--   'lease'    only the shard's capacity lease refused it: the caller takes
--              more capacity and sends it again;
--   'new'      admitted and written;
--   'error'    admitted, but the database refused to write it (a value it
--              cannot hold, an id reserved by a deferred start): err_code,
--              err_message and err_constraint say why.
-- Each decision sees the counts the start would have had were the group's
-- starts sent one after the other: the new runs admitted before it count,
-- the refused ones do not. The rule (harvest_admission_decide) is given by
-- the gateway (tenantcap.Rule.Params); p_algorithm NULL admits every start.
--
-- The admitted starts are written by one statement (harvest_start_write,
-- ON CONFLICT DO NOTHING on (tenant, id)); an id is not looked up before,
-- as nearly every start is new. A start admitted whose id existed (sent
-- again) was counted for the starts after it: the statement is undone and
-- the group decided again with that id known. Should the database refuse
-- the statement, the starts are decided again and written one at a time,
-- each in a block of its own, so that only the bad one fails. A start
-- refused whose id exists is answered as 'existing'. Then the tenants'
-- counts rise by their new runs (the trigger on tenant_running adds them
-- to the shard's count).
--
-- Rows come back in item order with, for a start that got as far as a
-- decision: own, the tenant's count before it; shard, the shard's count
-- before it; lease, the shard's lease; scheduled, the tenant's runs not due
-- yet including it when it is not due (else 0). For a new run also its pk,
-- its task, whether its task is due now, and whether its queue had pending
-- work before it (the queue's state before the statement, or an earlier
-- start of the group due now in that queue). created_at is the database
-- clock, the runs' created_at.
--
-- The statement turns synchronous_commit off for its transaction, so the
-- locks are held for the statement and its commit, not for the commit's
-- WAL flush: the caller answers the starts only after waiting for that
-- flush (RunStartFlush), in the same round trip.
--
-- p_notify[i] says whether start i's run is announced on NATS when it
-- ends (runs.notify); last and with a default, so that a gateway of the
-- previous release finds the function during a rolling upgrade (its runs
-- are announced, as before).
DROP FUNCTION IF EXISTS harvest_start_group(text[], text[], text[], text[], text[], text[], integer[], text[],
                                            bytea[], integer[], bigint[], timestamptz[], bigint[], text[],
                                            boolean[], text, double precision, bigint, bigint, bigint, boolean,
                                            bigint, boolean);
CREATE OR REPLACE FUNCTION harvest_start_group(p_tenants text[], p_ids text[], p_names text[], p_queues text[],
                                               p_keys text[], p_quota text[], p_priorities integer[],
                                               p_inputs text[], p_hashes bytea[], p_tries integer[],
                                               p_timeouts bigint[], p_run_at timestamptz[], p_delays bigint[],
                                               p_traces text[], p_skip boolean[], p_algorithm text,
                                               p_tfm double precision, p_max_runs bigint, p_static_limit bigint,
                                               p_others bigint, p_leased boolean, p_scheduled_cap bigint,
                                               p_closed boolean, p_notify boolean[] DEFAULT NULL)
RETURNS TABLE (ord integer, outcome text, reason text, run_pk bigint, task_id bigint, due boolean, busy boolean,
               own bigint, shard bigint, lease bigint, scheduled bigint, moved_to integer, err_code text,
               err_message text, err_constraint text, created_at timestamptz)
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
-- Generic plans, as in the outcome batch (and, set here, in what this calls:
-- harvest_start_write, the triggers of its inserts): every statement below
-- finds its rows by tenant, id or queue. Left to choose, the plan cache
-- planned several of them again on every call, their arrays making a
-- custom plan look cheaper, which was about a fifth of a one-start
-- group's time (docs/benchmarks.md, "A start group's fixed cost"). A
-- generic plan is made once per connection with the table sizes of that
-- moment, so sequential scans are ruled out: a plan made on a fresh shard
-- must still take the index once the shard has millions of runs
-- (TestStartGroupPlansOutliveTheShardsGrowth).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    v_n         integer := coalesce(cardinality(p_ids), 0);
    v_now       timestamptz := now();
    v_tenants   text[];      -- the group's tenants, in byte order
    v_k         integer;
    v_ti        integer[];   -- by start: its tenant's index in v_tenants
    v_due_at    timestamptz[];
    v_exists    boolean[];
    v_base      bigint[];    -- by tenant: its count before the group
    v_moved     integer[];   -- by tenant: where it moved, when fenced
    v_held      bigint[];    -- by tenant: its runs not due yet (NULL: not read)
    v_plus      bigint[];    -- by tenant: new runs admitted so far
    v_plus_held bigint[];    -- by tenant: of which not due yet
    v_busy_q    text[];      -- queues with pending work before the group
    v_due_q     text[];      -- queues a new run due now made busy
    v_local     bigint;
    v_lease     bigint;
    v_added     bigint;
    v_admit     integer[];
    v_t         integer;
    v_own       bigint;
    v_sched     bigint;
    v_why       text;
    v_state     text;
    v_message   text;
    v_con       text;
    v_pk        bigint;
    v_task      bigint;
    v_each      boolean;     -- write the starts one at a time
    v_again     boolean;
    o_outcome   text[];
    o_reason    text[];
    o_pk        bigint[];
    o_task      bigint[];
    o_busy      boolean[];
    o_own       bigint[];
    o_shard     bigint[];
    o_sched     bigint[];
    o_code      text[];
    o_msg       text[];
    o_con       text[];
    r           record;
BEGIN
    IF v_n <> coalesce(cardinality(p_tenants), 0) OR v_n <> coalesce(cardinality(p_names), 0)
       OR v_n <> coalesce(cardinality(p_queues), 0) OR v_n <> coalesce(cardinality(p_keys), 0)
       OR v_n <> coalesce(cardinality(p_quota), 0) OR v_n <> coalesce(cardinality(p_priorities), 0)
       OR v_n <> coalesce(cardinality(p_inputs), 0) OR v_n <> coalesce(cardinality(p_hashes), 0)
       OR v_n <> coalesce(cardinality(p_tries), 0) OR v_n <> coalesce(cardinality(p_timeouts), 0)
       OR v_n <> coalesce(cardinality(p_run_at), 0) OR v_n <> coalesce(cardinality(p_delays), 0)
       OR v_n <> coalesce(cardinality(p_traces), 0)
       OR (p_skip IS NOT NULL AND v_n <> cardinality(p_skip)) THEN
        RAISE EXCEPTION 'harvest_start_group: the arrays differ in length (% ids)', v_n;
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;

    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM harvest_shard_admission_lock();
    SELECT array_agg(d.t ORDER BY d.t COLLATE "C") INTO v_tenants
    FROM (SELECT DISTINCT u.t FROM unnest(p_tenants) AS u(t)) AS d;
    v_k := cardinality(v_tenants);
    -- Missing count rows first (no lock on the rows that exist), then every
    -- row locked in byte order, as every holder of several takes them.
    INSERT INTO tenant_running AS c (tenant, running)
    SELECT u.t, 0 FROM unnest(v_tenants) AS u(t) ORDER BY u.t COLLATE "C"
    ON CONFLICT (tenant) DO NOTHING;
    -- With each count: a tenant moving here is judged with its runs still
    -- on the old home (tenant_away); a tenant that moved away is fenced.
    v_base := array_fill(0::bigint, ARRAY[v_k]);
    v_moved := array_fill(NULL::integer, ARRAY[v_k]);
    FOR r IN SELECT c.tenant, c.running + coalesce(a.runs, 0) AS running, f.moved_to
             FROM tenant_running AS c
             LEFT JOIN tenant_away AS a ON a.tenant = c.tenant
             LEFT JOIN tenant_fences AS f ON f.tenant = c.tenant
             WHERE c.tenant = ANY (v_tenants)
             ORDER BY c.tenant COLLATE "C" FOR NO KEY UPDATE OF c LOOP
        v_t := array_position(v_tenants, r.tenant);
        v_base[v_t] := r.running;
        v_moved[v_t] := r.moved_to;
    END LOOP;
    -- A statement after the locks: the shard's count sees every start
    -- committed before them (the finishes committing meanwhile only make
    -- it a little high).
    SELECT harvest_shard_running(), harvest_shard_lease(),
           array_agg(array_position(v_tenants, i.tenant) ORDER BY i.n),
           array_agg(coalesce(i.run_at,
                              CASE WHEN i.delay > 0 THEN v_now + i.delay * interval '1 microsecond' END,
                              v_now) ORDER BY i.n)
    INTO v_local, v_lease, v_ti, v_due_at
    FROM unnest(p_tenants, p_run_at, p_delays) WITH ORDINALITY AS i(tenant, run_at, delay, n);
    -- One probe of the pending index per queue (a join would read the
    -- queue's whole backlog; harvest_queue_pending says why a function).
    v_busy_q := '{}';
    FOR r IN SELECT DISTINCT u.q FROM unnest(p_queues) AS u(q) LOOP
        IF harvest_queue_pending(r.q) THEN
            v_busy_q := v_busy_q || r.q;
        END IF;
    END LOOP;
    v_held := array_fill(NULL::bigint, ARRAY[v_k]);
    -- Whether a start's id exists is learnt by writing it (ON CONFLICT),
    -- not by a look-up first: nearly every start is new.
    v_exists := array_fill(false, ARRAY[v_n]);
    v_each := false;

    -- Decide every start, then write the admitted ones in one statement.
    -- When one of them existed after all (a start sent again), its id is
    -- known now: undo the statement and decide again without counting it,
    -- so the others are judged by the counts they really have. When the
    -- database refused the statement (a value it cannot hold), decide and
    -- write the starts one at a time, each in a block of its own, so that
    -- only the bad one fails.
    <<passes>>
    LOOP
        v_plus := array_fill(0::bigint, ARRAY[v_k]);
        v_plus_held := array_fill(0::bigint, ARRAY[v_k]);
        v_added := 0;
        v_admit := '{}';
        v_due_q := '{}';
        o_outcome := array_fill(NULL::text, ARRAY[v_n]);
        o_reason := array_fill(NULL::text, ARRAY[v_n]);
        o_pk := array_fill(NULL::bigint, ARRAY[v_n]);
        o_task := array_fill(NULL::bigint, ARRAY[v_n]);
        o_busy := array_fill(NULL::boolean, ARRAY[v_n]);
        o_own := array_fill(NULL::bigint, ARRAY[v_n]);
        o_shard := array_fill(NULL::bigint, ARRAY[v_n]);
        o_sched := array_fill(NULL::bigint, ARRAY[v_n]);
        o_code := array_fill(NULL::text, ARRAY[v_n]);
        o_msg := array_fill(NULL::text, ARRAY[v_n]);
        o_con := array_fill(NULL::text, ARRAY[v_n]);
        FOR i IN 1..v_n LOOP
            v_t := v_ti[i];
            IF v_moved[v_t] IS NOT NULL THEN
                o_outcome[i] := 'moved';
                CONTINUE;
            END IF;
            IF v_exists[i] THEN
                o_outcome[i] := 'existing';
                CONTINUE;
            END IF;
            IF coalesce(p_skip[i], false) THEN
                o_outcome[i] := 'skipped';
                CONTINUE;
            END IF;
            v_own := v_base[v_t] + v_plus[v_t];
            v_sched := 0;
            IF v_due_at[i] > v_now THEN
                IF v_held[v_t] IS NULL THEN
                    v_held[v_t] := (SELECT count(*) FROM runs AS h
                                    WHERE h.tenant = v_tenants[v_t] AND h.not_before > v_now
                                      AND h.finished_at IS NULL);
                END IF;
                v_sched := v_held[v_t] + v_plus_held[v_t] + 1;
            END IF;
            o_own[i] := v_own;
            o_shard[i] := v_local + v_added;
            o_sched[i] := v_sched;
            IF p_closed THEN
                v_why := 'closed';
            ELSIF p_algorithm IS NULL THEN
                v_why := NULL;
            ELSE
                v_why := harvest_admission_decide(p_algorithm, p_tfm, p_max_runs, p_static_limit, p_others,
                                                  p_leased, p_scheduled_cap, v_local + v_added, v_own, v_lease,
                                                  v_sched);
            END IF;
            IF v_why IS NOT NULL THEN
                o_outcome[i] := CASE WHEN v_why = 'lease' THEN 'lease' ELSE 'refused' END;
                o_reason[i] := v_why;
                CONTINUE;
            END IF;
            IF v_each THEN
                BEGIN
                    SELECT w.run_pk, w.task_id INTO v_pk, v_task
                    FROM harvest_start_write(p_tenants, p_ids, p_names, p_queues, p_keys, p_quota, p_priorities,
                                             p_inputs, p_hashes, p_tries, p_timeouts, p_traces, v_due_at,
                                             ARRAY[i], p_notify) AS w;
                EXCEPTION WHEN data_exception OR integrity_constraint_violation OR program_limit_exceeded THEN
                    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                                            v_con = CONSTRAINT_NAME;
                    o_outcome[i] := 'error';
                    o_code[i] := v_state;
                    o_msg[i] := v_message;
                    o_con[i] := nullif(v_con, '');
                    CONTINUE;
                END;
                IF v_pk IS NULL THEN
                    v_exists[i] := true; -- sent again: not counted
                    o_outcome[i] := 'existing';
                    CONTINUE;
                END IF;
                o_pk[i] := v_pk;
                o_task[i] := v_task;
            ELSE
                v_admit := v_admit || i;
            END IF;
            o_outcome[i] := 'new';
            o_busy[i] := p_queues[i] = ANY (v_busy_q) OR p_queues[i] = ANY (v_due_q);
            IF v_due_at[i] <= v_now THEN
                v_due_q := v_due_q || p_queues[i];
            END IF;
            v_plus[v_t] := v_plus[v_t] + 1;
            IF v_sched > 0 THEN
                v_plus_held[v_t] := v_plus_held[v_t] + 1;
            END IF;
            v_added := v_added + 1;
        END LOOP;
        EXIT passes WHEN v_each OR cardinality(v_admit) = 0;
        BEGIN
            FOR r IN SELECT w.ord, w.run_pk, w.task_id
                     FROM harvest_start_write(p_tenants, p_ids, p_names, p_queues, p_keys, p_quota, p_priorities,
                                              p_inputs, p_hashes, p_tries, p_timeouts, p_traces, v_due_at,
                                              v_admit, p_notify) AS w LOOP
                o_pk[r.ord] := r.run_pk;
                o_task[r.ord] := r.task_id;
            END LOOP;
            v_again := false;
            FOREACH v_t IN ARRAY v_admit LOOP
                IF o_pk[v_t] IS NULL THEN
                    v_exists[v_t] := true;
                    v_again := true;
                END IF;
            END LOOP;
            IF v_again THEN
                RAISE EXCEPTION USING ERRCODE = 'HA011'; -- undo, and decide again
            END IF;
            EXIT passes;
        EXCEPTION
            WHEN SQLSTATE 'HA011' THEN
                NULL;
            WHEN data_exception OR integrity_constraint_violation OR program_limit_exceeded THEN
                v_each := true;
        END;
    END LOOP;

    -- A start refused whose id exists is a start sent again: it is
    -- answered from the stored run, never refused. Planned on each call
    -- (EXECUTE), so that the unique index on (tenant, id) is used however
    -- small the table was when a cached plan would have been made.
    IF 'refused' = ANY (o_outcome) OR 'lease' = ANY (o_outcome) THEN
        SELECT array_agg(g.i) INTO v_admit FROM generate_subscripts(p_ids, 1) AS g(i)
        WHERE o_outcome[g.i] IN ('refused', 'lease');
        EXECUTE 'SELECT coalesce(array_agg(u.n), ''{}'') FROM unnest($1::int[]) AS u(n)
                 WHERE EXISTS (SELECT 1 FROM runs AS x WHERE x.tenant = ($2::text[])[u.n] AND x.id = ($3::text[])[u.n])'
        INTO v_admit USING v_admit, p_tenants, p_ids;
        FOREACH v_t IN ARRAY v_admit LOOP
            o_outcome[v_t] := 'existing';
            o_reason[v_t] := NULL;
        END LOOP;
    END IF;

    UPDATE tenant_running AS c SET running = c.running + a.n
    FROM (SELECT p_tenants[g.i] AS tenant, count(*)::integer AS n
          FROM generate_subscripts(p_ids, 1) AS g(i)
          WHERE o_outcome[g.i] = 'new'
          GROUP BY 1) AS a
    WHERE c.tenant = a.tenant;

    RETURN QUERY
        SELECT g.i::integer, o_outcome[g.i], o_reason[g.i], o_pk[g.i], o_task[g.i], v_due_at[g.i] <= v_now,
               o_busy[g.i], o_own[g.i], o_shard[g.i], v_lease, o_sched[g.i], v_moved[v_ti[g.i]], o_code[g.i],
               o_msg[g.i], o_con[g.i], v_now
        FROM generate_subscripts(p_ids, 1) AS g(i)
        ORDER BY g.i;
END
$$;
