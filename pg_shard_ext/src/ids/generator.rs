//! The id generator's state: one clock position per prefix in shared
//! memory (every backend and database of the server draws from it), and
//! this node's generator number, which keeps ids of different nodes apart
//! (see [`pg_shard_core::routing_id`]).

use crate::error::{OrReport, Result, ShardError};
use pg_shard_core::routing_id::{self, GENERATORS, PREFIXES};
use pgrx::prelude::*;
use pgrx::{PGRXSharedMemory, PgAtomic};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The last clock position given out per prefix.
pub(crate) struct Clocks {
    positions: [AtomicU64; PREFIXES],
}

// SAFETY: a fixed-size array of atomics, valid at any address and in any
// process that maps the segment; it holds no pointers.
unsafe impl PGRXSharedMemory for Clocks {}

impl Clocks {
    fn new() -> Clocks {
        Clocks {
            positions: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

// SAFETY: the name is pg_shard's own, used by no other shared memory.
static CLOCKS: PgAtomic<Clocks> = unsafe { PgAtomic::new(c"pg_shard id clocks") };

/// Set in the postmaster when pg_shard is preloaded (and so in every
/// backend it forks): only then does the shared memory exist.
static PRELOADED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This node's generator number, read once per backend (None: not read).
    static GENERATOR: Cell<Option<Option<i32>>> = const { Cell::new(None) };
}

/// Requests the shared memory; from `_PG_init` while
/// shared_preload_libraries are loaded.
// (The macro tests features of other PostgreSQL versions than ours.)
#[allow(unexpected_cfgs)]
pub(crate) fn register_shared_memory() {
    pgrx::pg_shmem_init!(CLOCKS = Clocks::new());
    PRELOADED.store(true, Ordering::Relaxed);
}

/// Forget the cached generator number (relcache invalidation: add_node
/// records it with one).
pub(crate) fn forget() {
    GENERATOR.set(None);
}

/// Longest a generator waits for the wall clock to reach its position:
/// more than that, and the clock went back (it carries on ahead of it).
const MAX_WAIT_MS: i64 = 2000;

/// The next clock position for `prefix`: the later of now and the last one
/// plus one, taken atomically; when that is ahead of the clock (the
/// millisecond's counter used up), after waiting for the clock.
pub(crate) fn next_position(prefix: u16) -> Result<u64> {
    if !PRELOADED.load(Ordering::Relaxed) {
        return Err(ShardError::InvalidArgument(
            "pg_shard.next_id needs pg_shard in shared_preload_libraries".into(),
        ));
    }
    let slot = &CLOCKS.get().positions[prefix as usize % PREFIXES];
    loop {
        let now_ms = wall_clock_ms() - routing_id::EPOCH_MS;
        let last = slot.load(Ordering::Relaxed);
        let next = routing_id::next_position(last, now_ms);
        let lead = routing_id::position_time(next) - now_ms;
        if lead > 0 && lead <= MAX_WAIT_MS {
            // Ids made ahead of the clock could be made again after a
            // restart (the positions live in shared memory only).
            pgrx::check_for_interrupts!();
            std::thread::sleep(std::time::Duration::from_micros(50));
            continue;
        }
        if slot
            .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Ok(next);
        }
    }
}

fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// This node's generator number: 0 on the metadata node (a server that
/// add_node has not made a worker), the node id on a worker whose id is
/// below 32.
pub(crate) fn generator() -> Result<i32> {
    let known = match GENERATOR.get() {
        Some(known) => known,
        None => {
            let node_id =
                crate::spi::query_value::<i32>("SELECT node_id FROM pg_shard.local_node")?;
            let known = match node_id {
                // A server holding shards is a worker: without its record
                // (not added by add_node, or restored without it) it would
                // take the metadata node's number.
                None if has_shards()? => {
                    return Err(ShardError::NoIdGenerator(
                        "this server holds shards but has no pg_shard.local_node record \
                         (add_node writes it)"
                            .into(),
                    ))
                }
                None => Some(0),
                Some(id) if (1..GENERATORS).contains(&id) => Some(id),
                Some(_) => None,
            };
            GENERATOR.set(Some(known));
            known
        }
    };
    known.ok_or_else(|| {
        ShardError::NoIdGenerator(format!(
            "this worker's node id is {} or more, and only the metadata node and workers 1 to {} \
             make ids",
            GENERATORS,
            GENERATORS - 1
        ))
    })
}

fn has_shards() -> Result<bool> {
    Ok(
        crate::spi::query_value::<bool>("SELECT EXISTS (SELECT 1 FROM pg_shard.local_shard)")?
            .unwrap_or(false),
    )
}

/// `pg_shard.record_local_node(node_id integer)`: add_node tells a worker
/// which node it is; every backend of the database reads its generator
/// number again.
#[pg_extern(schema = "pg_shard", volatile, parallel_unsafe)]
fn record_local_node(node_id: i32) {
    crate::spi::run_with_args(
        "INSERT INTO pg_shard.local_node (singleton, node_id) VALUES (true, $1) \
         ON CONFLICT (singleton) DO UPDATE SET node_id = EXCLUDED.node_id",
        &[node_id.into()],
    )
    .map_err(ShardError::from)
    .or_report();
    let relid =
        crate::spi::query_value::<pg_sys::Oid>("SELECT 'pg_shard.local_node'::regclass::oid")
            .or_report()
            .unwrap_or(pg_sys::InvalidOid);
    // SAFETY: queues a relcache invalidation sent at commit.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
}
