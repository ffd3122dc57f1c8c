//! The logical replication of a job: a [`Link`] in each direction (source
//! to target until the cutover, target back to source after it until the
//! job completes or reverts), the marker rows that tell when one side has
//! applied everything the other committed, and the write pause of a
//! cutover.

use super::job::Job;
use super::node_access::{connect, exists_on, poll_until, run_on, value_on};
use super::pause_clock::PauseClock;
use super::settings::FINAL_WAIT;
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
    /// WAL position: a new one each time, also when a step runs again.)
    fn insert_marker(&self, job: &Job, publisher: &mut Client) -> Result<i64> {
        value_on::<i64>(
            self.publisher,
            publisher,
            &format!(
                "INSERT INTO {} SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint | {} \
                 RETURNING job",
                marker_table(job),
                self.marker_bit
            ),
        )?
        .ok_or_else(|| ShardError::InvalidArgument("the marker row was not written".into()))
    }

    /// Waits (polling every millisecond: this is inside a write pause) for
    /// the subscriber to have applied marker row `marker`.
    fn wait_for_marker(&self, job: &Job, subscriber: &mut Client, marker: i64) -> Result<()> {
        poll_until(
            self.subscriber,
            subscriber,
            &format!(
                "SELECT EXISTS (SELECT 1 FROM {} WHERE job = {marker})",
                marker_table(job)
            ),
            (Duration::from_millis(1), FINAL_WAIT),
            &format!(
                "{}:{} did not apply the last writes",
                self.subscriber.host, self.subscriber.port
            ),
        )
    }

    /// Before a cutover's lock: a marker row written and awaited on the
    /// subscriber, so that the apply has caught up to a moment ago and the
    /// drain under the lock only waits for the writes since.
    pub(crate) fn drain_unlocked(
        &self,
        job: &Job,
        (publisher, subscriber): (&mut Client, &mut Client),
    ) -> Result<()> {
        let marker = self.insert_marker(job, publisher)?;
        self.wait_for_marker(job, subscriber, marker)
    }

    /// The first half of a cutover in this direction: the publisher's
    /// `tables` locked EXCLUSIVE in a transaction of `lock_holder` (a
    /// connection made before the pause), returned (writers wait, readers
    /// go on), and its shards `ids` retired in that transaction (it commits
    /// in [`Link::hand_over`]); a marker row written and awaited on the
    /// subscriber (every write before the lock is there).
    pub(crate) fn freeze_and_drain(
        &self,
        job: &Job,
        (tables, ids): (&[String], &str),
        mut lock_holder: Client,
        (publisher, subscriber): (&mut Client, &mut Client),
        pause: &mut PauseClock,
    ) -> Result<Client> {
        lock_for_cutover(job, self.publisher, &mut lock_holder, tables)?;
        pause.mark("locked");
        run_on(
            self.publisher,
            &mut lock_holder,
            &format!("UPDATE pg_shard.local_shard SET state = 'retired' WHERE shard_id IN ({ids})"),
        )?;
        let marker = self.insert_marker(job, publisher)?;
        self.wait_for_marker(job, subscriber, marker)?;
        pause.mark("drained");
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
        crate::metadata::catalog::bump_map_version()
    }

    /// The second half of a cutover in this direction: the lock's
    /// transaction, which retired the publisher's shards `ids`, commits (the
    /// writers that waited are refused with WrongShard and look for the new
    /// map), and at the same time the subscriber's shards are activated at
    /// `version`, the map version [`Link::publish_ahead`] took (no router
    /// declares it before it is published: the subscriber refuses older
    /// ones). The runner's commit that follows publishes the map.
    pub(crate) fn hand_over(
        &self,
        mut lock_holder: Client,
        (ids, version): (&str, i64),
        subscriber: &mut Client,
        pause: &mut PauseClock,
    ) -> Result<()> {
        // The retire's commit on its own thread (it only talks to the
        // node), while this one activates the subscriber's shards.
        let ((retired, retired_at), activated) = std::thread::scope(|scope| {
            let retiring = scope.spawn(|| {
                let retired = run_on(self.publisher, &mut lock_holder, "COMMIT");
                (retired, Instant::now())
            });
            let activated = run_on(
                self.subscriber,
                subscriber,
                &format!(
                    "UPDATE pg_shard.local_shard SET state = 'active', epoch = {version} \
                     WHERE shard_id IN ({ids})"
                ),
            )
            .map(|()| Instant::now());
            let retired = retiring.join().unwrap_or_else(|_| {
                (
                    Err(ShardError::JobPanicked(
                        "the retire's thread panicked".into(),
                    )),
                    Instant::now(),
                )
            });
            (retired, activated)
        });
        if let Err(e) = retired {
            // The publisher still owns the shards: the subscriber's go back
            // to what they were (best effort; a repeated cutover activates
            // them again).
            if activated.is_ok() {
                let _ = run_on(
                    self.subscriber,
                    subscriber,
                    &format!(
                        "UPDATE pg_shard.local_shard SET {} WHERE shard_id IN ({ids})",
                        self.subscriber_shards_before()
                    ),
                );
            }
            return Err(e);
        }
        let activated_at = activated?;
        pause.mark_at("retired", retired_at);
        pause.mark_at("activated", activated_at);
        pause.mark("published");
        Ok(())
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
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
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
/// transaction of the returned connection: writers wait, readers go on.
/// The lock waits at most the job's `pg_shard.cutover_lock_timeout` for
/// the transactions in flight (writers that come meanwhile queue behind
/// it): past it, [`ShardError::CutoverLockBusy`] (the runner gives the
/// step up, with its catalog changes, and tries again).
pub(crate) fn lock_for_cutover(
    job: &Job,
    node: &Node,
    lock_holder: &mut Client,
    tables: &[String],
) -> Result<()> {
    let waited_ms = query_one::<i64>(
        "SELECT (resources->>'lock_wait_ms')::bigint FROM pg_shard.job WHERE job_id = $1",
        &[job.job_id.into()],
    )?
    .filter(|ms| *ms > 0)
    .unwrap_or(DEFAULT_LOCK_WAIT_MS) as u64;
    let locked = lock_holder.batch_execute(&format!(
        "BEGIN;\nSET LOCAL lock_timeout = {waited_ms};\nLOCK TABLE {} IN EXCLUSIVE MODE;\n\
         SET LOCAL lock_timeout = 0",
        tables.join(", ")
    ));
    match locked {
        Ok(()) => Ok(()),
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

/// A job queued before `pg_shard.cutover_lock_timeout` existed: its
/// default.
const DEFAULT_LOCK_WAIT_MS: i64 = 100;

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
