//! The logical replication of a job: a [`Link`] in each direction (source
//! to target until the cutover, target back to source after it until the
//! job completes or reverts), the marker rows that tell when one side has
//! applied everything the other committed, and the write pause of a
//! cutover.

use super::job::Job;
use super::node_access::{batch_value, connect, exists_on, last_value, run_on, value_on};
use super::pause_clock::PauseClock;
use super::settings::{APPLY_WAIT, FINAL_WAIT, LOCK_WAIT};
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::quote;
use crate::spi::query_one;
use postgres::Client;
use std::time::{Duration, Instant};

/// Object names of a job: publication, slot and subscription share one.
pub(crate) fn replication_name(job: &Job) -> String {
    format!("pg_shard_job_{}", job.job_id)
}

/// The job's marker table (one on each side; a move publishes it with the
/// shard tables in both directions).
pub(crate) fn marker_table(job: &Job) -> String {
    quote::qualified("pg_shard", &format!("job_{}_marker", job.job_id))
}

/// The statements that make the job's marker table on a node: marker rows
/// by number; an activation marker names the shards that its apply
/// activates on the receiving side, and the map version
/// (`pg_shard.marker_activation()`, enabled REPLICA: it fires in the
/// apply, a replica session, and never for the job's own writes of the
/// marker on the side that sends it).
pub(crate) fn marker_table_script(job: &Job) -> String {
    let table = marker_table(job);
    format!(
        "CREATE TABLE IF NOT EXISTS {table} \
             (job bigint PRIMARY KEY, activate_version bigint, activate_shards bigint[], \
              applied_at timestamptz);\n\
         CREATE OR REPLACE TRIGGER pg_shard_activation BEFORE INSERT ON {table} \
             FOR EACH ROW EXECUTE FUNCTION pg_shard.marker_activation();\n\
         ALTER TABLE {table} ENABLE REPLICA TRIGGER pg_shard_activation"
    )
}

/// One direction of a job's replication: a publication and a `pgoutput`
/// slot on `publisher`, a subscription on `subscriber`, sharing one name.
/// (A split subscribes nothing: its own apply reads the slot.)
pub(crate) struct Link<'a> {
    pub(crate) name: String,
    pub(crate) publisher: &'a Node,
    pub(crate) subscriber: &'a Node,
    /// Marker rows written on the publisher for this direction carry this
    /// bit, so that the two directions' markers never collide.
    marker_bit: i64,
}

impl<'a> Link<'a> {
    /// Source to target: the copy's catch-up until the cutover.
    pub(crate) fn forward(job: &'a Job) -> Link<'a> {
        Link {
            name: replication_name(job),
            publisher: &job.source,
            subscriber: &job.target,
            marker_bit: 0,
        }
    }

    /// Target back to source: from the cutover until the job completes or
    /// reverts, the old copy receives the new owner's writes.
    pub(crate) fn reverse(job: &'a Job) -> Link<'a> {
        Link {
            name: format!("{}_reverse", replication_name(job)),
            publisher: &job.target,
            subscriber: &job.source,
            marker_bit: 1 << 62,
        }
    }

    /// What the subscriber's shards were before a cutover activated them:
    /// forward, the new copy (frozen at epoch 0, what a rollback drops);
    /// reverse, the old copy (retired).
    fn subscriber_shards_before(&self) -> &'static str {
        if self.marker_bit == 0 {
            "state = 'frozen', epoch = 0"
        } else {
            "state = 'retired'"
        }
    }

    /// Makes sure the publication (of `tables`) and the slot exist.
    pub(crate) fn publish_and_reserve_slot(
        &self,
        publisher: &mut Client,
        tables: &[String],
    ) -> Result<()> {
        let node = self.publisher;
        if !exists_on(node, publisher, "pg_publication", "pubname", &self.name)? {
            run_on(
                node,
                publisher,
                &format!(
                    "CREATE PUBLICATION {} FOR TABLE {}",
                    quote::ident(&self.name),
                    tables.join(", ")
                ),
            )?;
        }
        if !exists_on(
            node,
            publisher,
            "pg_replication_slots",
            "slot_name",
            &self.name,
        )? {
            run_on(
                node,
                publisher,
                &format!(
                    "SELECT pg_create_logical_replication_slot({}, 'pgoutput')",
                    quote::literal(&self.name)
                ),
            )?;
        }
        Ok(())
    }

    /// Moves the slot up to `position` (what it would stream before it is
    /// had otherwise), once the publisher's WAL is flushed past it: a slot
    /// only moves over flushed WAL.
    pub(crate) fn advance_slot(&self, publisher: &mut Client, position: &str) -> Result<()> {
        let node = self.publisher;
        flush_wal(node, publisher)?;
        let started = Instant::now();
        loop {
            let flushed = value_on::<bool>(
                node,
                publisher,
                &format!(
                    "SELECT pg_current_wal_flush_lsn() >= {}::pg_lsn",
                    quote::literal(position)
                ),
            )?
            .unwrap_or(false);
            if flushed {
                break;
            }
            if started.elapsed() > FINAL_WAIT {
                return Err(ShardError::Timeout(format!(
                    "{}:{} did not flush its WAL to {position} within {FINAL_WAIT:?}",
                    node.host, node.port
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        run_on(
            node,
            publisher,
            &format!(
                "SELECT pg_replication_slot_advance(slot_name, {position}) FROM pg_replication_slots \
                 WHERE slot_name = {} AND confirmed_flush_lsn < {position}",
                quote::literal(&self.name),
                position = quote::literal(position),
            ),
        )
    }

    /// The subscription streaming from the slot where it stands: no
    /// initial copy of its own, no slot of its own.
    pub(crate) fn subscribe(&self, subscriber: &mut Client) -> Result<()> {
        if exists_on(
            self.subscriber,
            subscriber,
            "pg_subscription",
            "subname",
            &self.name,
        )? {
            return Ok(());
        }
        let database =
            query_one::<String>("SELECT current_database()::text", &[])?.unwrap_or_default();
        let user = query_one::<String>("SELECT current_user::text", &[])?.unwrap_or_default();
        let connection = format!(
            "host={} port={} dbname={} user={} application_name={}",
            conninfo_value(&self.publisher.host),
            self.publisher.port,
            conninfo_value(&database),
            conninfo_value(&user),
            conninfo_value(&self.name),
        );
        // Not in a transaction block: CREATE SUBSCRIPTION connects to the
        // publisher.
        run_on(
            self.subscriber,
            subscriber,
            &format!(
                "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} \
                 WITH (slot_name = {}, create_slot = false, copy_data = false)",
                quote::ident(&self.name),
                quote::literal(&connection),
                quote::ident(&self.name),
                quote::literal(&self.name),
            ),
        )
    }

    /// Bytes of the publisher's WAL the subscriber has not confirmed (None:
    /// no slot).
    pub(crate) fn lag(&self, publisher: &mut Client) -> Result<Option<i64>> {
        Ok(value_on::<Option<i64>>(
            self.publisher,
            publisher,
            &format!(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint \
                 FROM pg_replication_slots WHERE slot_name = {}",
                quote::literal(&self.name)
            ),
        )?
        .flatten())
    }

    /// Writes a marker row on the publisher, in a transaction of its own,
    /// and returns its number: once the subscriber has it, it has every
    /// change the publisher committed before. (A number of the publisher's
    /// WAL position: a new one each time, also when a step runs again.) It is
    /// also a rehearsal of the activation of the subscriber's shards `ids`
    /// (activation version 0: its apply does the activation's work and
    /// changes nothing), committed with a change to the publisher's records
    /// of them that changes nothing either: the first activation's apply
    /// and the first decoding of a retire would otherwise start cold
    /// (functions compiled, catalogs looked up) inside the pause.
    fn insert_marker(&self, job: &Job, publisher: &mut Client, ids: &str) -> Result<i64> {
        let marker = batch_value(
            self.publisher,
            publisher,
            &format!(
                // (One implicit transaction.)
                "UPDATE pg_shard.local_shard SET state = state WHERE shard_id IN ({ids});\n\
                 INSERT INTO {} (job, activate_version, activate_shards) \
                 SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint | {}, 0, ARRAY[{ids}]::bigint[] \
                 RETURNING job",
                marker_table(job),
                self.marker_bit
            ),
        )?;
        marker
            .and_then(|m| m.parse().ok())
            .ok_or_else(|| ShardError::InvalidArgument("the marker row was not written".into()))
    }

    /// Waits for the subscriber to have applied marker row `marker`, at
    /// most `longest`: one call on the subscriber, which answers as soon as
    /// it sees the row (`pg_shard.await_marker`, woken by the apply's
    /// notification on `pg_shard_marker` when the session LISTENs:
    /// [`Link::drain_unlocked`]). Returns the subscriber's WAL position then,
    /// flushed, and when its apply activated shards (µs since the epoch, the
    /// subscriber's clock). With `activated` (the shard ids and version an
    /// activation marker names), the marker's apply must have activated
    /// them: else an error.
    fn wait_for_marker(
        &self,
        job: &Job,
        subscriber: &mut Client,
        marker: i64,
        (activated, longest): (Option<(&str, i64)>, Duration),
    ) -> Result<(String, Option<i64>)> {
        let (ids, version) = match activated {
            Some((ids, version)) => (format!("ARRAY[{ids}]::bigint[]"), version.to_string()),
            None => ("NULL".to_string(), "NULL".to_string()),
        };
        let timeout_ms = i32::try_from(longest.as_millis()).unwrap_or(i32::MAX);
        let seen = subscriber
            .query_typed_opt(
                &format!(
                    "SELECT flushed_to, activated, applied_at FROM pg_shard.await_marker(\
                     {}::regclass, {marker}, {ids}, {version}, {timeout_ms})",
                    quote::literal(&marker_table(job))
                ),
                &[],
            )
            .map_err(|e| crate::transaction::client::remote_error(self.subscriber, &e))?;
        match seen {
            Some(row) if row.get::<_, bool>(1) => Ok((row.get(0), row.get(2))),
            Some(_) => Err(ShardError::Internal(format!(
                "{}:{} applied the cutover's marker without activating the shards",
                self.subscriber.host, self.subscriber.port
            ))),
            None => Err(ShardError::Timeout(format!(
                "{}:{} did not apply the last writes within {longest:?}",
                self.subscriber.host, self.subscriber.port
            ))),
        }
    }

    /// Before a cutover's lock: a marker row written and awaited on the
    /// subscriber, so that the apply has caught up to a moment ago and the
    /// drain under the lock only waits for the writes since; it rehearses
    /// the activation of `ids`.
    pub(crate) fn drain_unlocked(
        &self,
        job: &Job,
        ids: &str,
        (publisher, subscriber): (&mut Client, &mut Client),
    ) -> Result<()> {
        run_on(self.subscriber, subscriber, "LISTEN pg_shard_marker")?;
        let marker = self.insert_marker(job, publisher, ids)?;
        self.wait_for_marker(job, subscriber, marker, (None, FINAL_WAIT))
            .map(|_| ())
    }

    /// A cutover in this direction, from its lock to the subscriber's
    /// activation (the runner's commit that follows publishes the map).
    /// In one round trip over `lock_holder` (a connection made before the
    /// pause): the publisher's `tables` locked EXCLUSIVE (writers wait,
    /// readers go on), its shards `ids` retired and an activation marker
    /// written, committed together (the writers that waited are refused
    /// with WrongShard and look for the new map). Nothing is written in
    /// between, so the retire need not wait for the drain. The marker
    /// names the subscriber's shards and `version`, the map version
    /// [`Link::publish_ahead`] took: its apply on the subscriber activates
    /// them, in its own transaction, once every write before the lock is
    /// there (`pg_shard.marker_activation()`; no router declares the
    /// version before it is published, and the subscriber refuses older
    /// ones). The job waits for the marker, and returns the subscriber's
    /// WAL position then (every later write of its shards is the new
    /// owner's). A failure after the retire vetoes the activation and makes
    /// the publisher's shards active again.
    pub(crate) fn cut_over(
        &self,
        job: &Job,
        (tables, ids, version): (&[String], &str, i64),
        mut lock_holder: Client,
        (publisher, subscriber): (&mut Client, &mut Client),
        pause: &mut PauseClock,
    ) -> Result<String> {
        let marker = activation_marker() | self.marker_bit;
        // (Read before the lock: the wait for the marker is inside the pause.)
        let longest = job.recorded_wait(APPLY_WAIT.0, APPLY_WAIT.1)?;
        let locked = lock_for_cutover(
            job,
            self.publisher,
            &mut lock_holder,
            tables,
            &format!(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint;\n\
                 UPDATE pg_shard.local_shard SET state = 'retired' WHERE shard_id IN ({ids});\n\
                 INSERT INTO {} (job, activate_version, activate_shards) \
                     VALUES ({marker}, {version}, ARRAY[{ids}]::bigint[]);\n\
                 COMMIT",
                marker_table(job)
            ),
        );
        match locked {
            Ok(locked_at) => pause.mark_at("locked", locked_at.and_then(|t| t.parse().ok())),
            Err(e @ ShardError::CutoverLockBusy { .. }) => return Err(e),
            // (The commit's outcome is not known: the retire may be in.)
            Err(e) => return Err(self.give_back(job, (publisher, subscriber), (ids, marker), e)),
        }
        pause.mark("retired");
        match self.wait_for_marker(job, subscriber, marker, (Some((ids, version)), longest)) {
            Ok((position, applied_at)) => {
                pause.mark_at("applied", applied_at);
                pause.mark("activated");
                pause.mark("published");
                Ok(position)
            }
            Err(e) => Err(self.give_back(job, (publisher, subscriber), (ids, marker), e)),
        }
    }

    /// After a cutover failed past its retire (`error`), best effort (the
    /// step runs again, or the job's rollback activates the publisher's
    /// shards): the activation by `marker` vetoed on the subscriber, and
    /// undone if it happened; the publisher's shards `ids` active again,
    /// so that the group is not left without an owner. Returns `error`.
    fn give_back(
        &self,
        job: &Job,
        (publisher, subscriber): (&mut Client, &mut Client),
        (ids, marker): (&str, i64),
        error: ShardError,
    ) -> ShardError {
        let vetoed = run_on(
            self.subscriber,
            subscriber,
            &format!(
                "BEGIN;\n\
                 UPDATE pg_shard.local_shard SET state = state WHERE shard_id IN ({ids});\n\
                 INSERT INTO {} (job) VALUES ({}) ON CONFLICT DO NOTHING;\n\
                 UPDATE pg_shard.local_shard SET {} WHERE shard_id IN ({ids}) AND state = 'active';\n\
                 COMMIT",
                marker_table(job),
                marker | VETO_BIT,
                self.subscriber_shards_before(),
            ),
        );
        let reactivated = vetoed.and_then(|()| {
            run_on(
                self.publisher,
                publisher,
                &format!(
                    "UPDATE pg_shard.local_shard SET state = 'active' \
                     WHERE shard_id IN ({ids}) AND state = 'retired'"
                ),
            )
        });
        if let Err(e) = reactivated {
            // The shards stay retired on both sides until the step runs
            // again (a node that cannot be reached may still apply the
            // marker): routers wait.
            pgrx::log!(
                "pg_shard: after a failed cutover, {}:{} could not take its shards back: {e}",
                self.publisher.host,
                self.publisher.port
            );
        }
        error
    }

    /// The connection a cutover in this direction takes its lock over
    /// ([`Link::cut_over`]): made before the pause, and warmed up with the
    /// statements it runs under the lock ([`warm_up`]).
    pub(crate) fn lock_holder(
        &self,
        job: &Job,
        (tables, ids): (&[String], &str),
    ) -> Result<Client> {
        let mut lock_holder = connect(self.publisher)?;
        warm_up(
            self.publisher,
            &mut lock_holder,
            (tables, ids),
            &format!("INSERT INTO {} (job) VALUES (0);", marker_table(job)),
        )?;
        Ok(lock_holder)
    }

    /// Before a cutover's lock in this direction: the group's placement
    /// moved to the subscriber and the next map version taken, in the
    /// runner's transaction (published when it commits, after
    /// [`Link::hand_over`]; nothing of it depends on the drain). The
    /// version's row stays locked until then: a concurrent map change
    /// waits, and one in progress makes the cutover wait before its lock,
    /// not during the pause. Returns the version.
    pub(crate) fn publish_ahead(&self, job: &Job) -> Result<i64> {
        crate::spi::run_with_args(
            "UPDATE pg_shard.placement SET node_id = $3 WHERE shard_group_id = $1 AND node_id = $2",
            &[
                job.shard_group_id.into(),
                self.publisher.node_id.into(),
                self.subscriber.node_id.into(),
            ],
        )?;
        crate::metadata::catalog::bump_map_version_for(&[job.shard_group_id])
    }

    /// Drops the subscription (with its slot), a slot left without one,
    /// and the publication. A subscriber that cannot be reached (a node
    /// that is down) keeps its subscription, but the slot goes anyway (its
    /// walsender ended first): a slot nobody reads would keep the
    /// publisher's WAL without end. (The subscription, when its node comes
    /// back, finds no slot and only logs so, until it is dropped.)
    pub(crate) fn drop(&self) -> Result<()> {
        match connect(self.subscriber) {
            Ok(mut subscriber) => {
                if exists_on(
                    self.subscriber,
                    &mut subscriber,
                    "pg_subscription",
                    "subname",
                    &self.name,
                )? {
                    run_on(
                        self.subscriber,
                        &mut subscriber,
                        &format!("DROP SUBSCRIPTION {}", quote::ident(&self.name)),
                    )?;
                }
            }
            Err(ShardError::Unreachable { .. }) => {
                pgrx::log!(
                    "pg_shard: {}:{} cannot be reached; replication slot {} is dropped without its subscription",
                    self.subscriber.host,
                    self.subscriber.port,
                    self.name
                );
            }
            Err(e) => return Err(e),
        }
        let mut publisher = connect(self.publisher)?;
        run_on(
            self.publisher,
            &mut publisher,
            &format!(
                // (Waiting for it to end: the slot is its until then. A
                // split's stream of its slot is closed in the cutover; its
                // walsender may still be ending, or be left by a runner
                // that died.)
                "SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots \
                 WHERE slot_name = {} AND active_pid IS NOT NULL",
                quote::literal(&self.name)
            ),
        )?;
        // The slot goes with the subscription; one left by a subscription
        // that was never made (or lost its connection) goes here.
        if exists_on(
            self.publisher,
            &mut publisher,
            "pg_replication_slots",
            "slot_name",
            &self.name,
        )? {
            run_on(
                self.publisher,
                &mut publisher,
                &format!(
                    "SELECT pg_drop_replication_slot({})",
                    quote::literal(&self.name)
                ),
            )?;
        }
        run_on(
            self.publisher,
            &mut publisher,
            &format!("DROP PUBLICATION IF EXISTS {}", quote::ident(&self.name)),
        )
    }
}

/// A value in a libpq connection string, quoted.
pub(crate) fn conninfo_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Flushes `node`'s WAL up to now: a synchronous commit that writes WAL (a
/// logical message, which no subscription receives). The node may commit
/// asynchronously, and an idle node flushes nothing, while slots and their
/// readers only go as far as the flushed end.
pub(crate) fn flush_wal(node: &Node, client: &mut Client) -> Result<()> {
    run_on(
        node,
        client,
        "SELECT pg_logical_emit_message(true, 'pg_shard', 'flush')",
    )
}

/// Takes the EXCLUSIVE lock of a cutover on `tables` of `node`, in a
/// transaction of `lock_holder`: writers wait, readers go on; and runs
/// `then` (statements, which may commit) in the same round trip. Returns
/// the first column of the last row `then` returned.
/// READ COMMITTED whatever the node's default: `then` must see what the
/// job's other connections committed before it (a split's last writes
/// update the progress row its drain rounds wrote).
/// The lock waits at most the job's `pg_shard.cutover_lock_timeout` for
/// the transactions in flight (writers that come meanwhile queue behind
/// it): past it, [`ShardError::CutoverLockBusy`] (the runner gives the
/// step up, with its catalog changes, and tries again).
pub(crate) fn lock_for_cutover(
    job: &Job,
    node: &Node,
    lock_holder: &mut Client,
    tables: &[String],
    then: &str,
) -> Result<Option<String>> {
    let waited_ms = job.recorded_wait(LOCK_WAIT.0, LOCK_WAIT.1)?.as_millis() as u64;
    let locked = lock_holder.simple_query(&format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED;\nSET LOCAL lock_timeout = {waited_ms};\n\
         LOCK TABLE {} IN EXCLUSIVE MODE;\n\
         SET LOCAL lock_timeout = 0;\n{then}",
        tables.join(", ")
    ));
    match locked {
        Ok(messages) => Ok(last_value(&messages)),
        Err(e) if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
            // (The connection's transaction is aborted: it is dropped.)
            Err(ShardError::CutoverLockBusy {
                node: format!("{}:{}", node.host, node.port),
                waited_ms,
            })
        }
        Err(e) => Err(crate::transaction::client::remote_error(node, &e)),
    }
}

/// The number of a cutover's activation marker: unique (the time in
/// microseconds; a new one each time, also when a step runs again), chosen
/// before the marker is written, so that a failure whose outcome is not
/// known can still veto it. Bit 60 keeps it apart from the numbers made of
/// WAL positions (below 2^60), [`VETO_BIT`] from its veto.
fn activation_marker() -> i64 {
    (1 << 60) | (unix_micros() & ((1 << 60) - 1))
}

/// Microseconds since the Unix epoch, for numbers and marks that must not
/// repeat.
pub(crate) fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

/// A veto of activation marker `m` is the row `m | VETO_BIT` on the
/// subscriber (`pg_shard.marker_activation()` looks for it).
const VETO_BIT: i64 = 1 << 61;

/// Before a cutover's pause: `lock_holder` (a new connection) made ready
/// for its round trips under the lock, `tables` and the ownership records
/// of `ids` looked up once and `warm` run, in a transaction rolled back. A
/// new server process reads its caches at first use (relations, triggers,
/// their functions compiled): measured at 5-15 ms on a busy node, which
/// writers would otherwise wait for.
pub(crate) fn warm_up(
    node: &Node,
    lock_holder: &mut Client,
    (tables, ids): (&[String], &str),
    warm: &str,
) -> Result<()> {
    let lookups: Vec<String> = tables
        .iter()
        .map(|table| format!("{}::regclass", quote::literal(table)))
        .collect();
    run_on(
        node,
        lock_holder,
        &format!(
            "BEGIN;\nSELECT {};\n\
             UPDATE pg_shard.local_shard SET state = state WHERE shard_id IN ({ids});\n{warm}\n\
             ROLLBACK",
            lookups.join(", ")
        ),
    )
}

/// Drops the job's replication in both directions and its marker tables.
pub(crate) fn drop_replication(job: &Job) -> Result<()> {
    Link::forward(job).drop()?;
    Link::reverse(job).drop()?;
    drop_markers(job)
}

/// Drops the marker tables on both sides.
pub(crate) fn drop_markers(job: &Job) -> Result<()> {
    for node in [&job.target, &job.source] {
        let mut client = connect(node)?;
        run_on(
            node,
            &mut client,
            &format!("DROP TABLE IF EXISTS {}", marker_table(job)),
        )?;
    }
    Ok(())
}
