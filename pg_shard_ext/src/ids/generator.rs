//! The id generator's state: one clock position per prefix in shared
//! memory (every backend and database of the server draws from it), and
//! this node's generator number, which keeps ids of different nodes apart
//! (see [`pg_shard_core::routing_id`]).

use crate::error::{OrReport, Result, ShardError};
use pg_shard_core::routing_id::{self, GENERATORS, PREFIXES};
use pgrx::prelude::*;
use pgrx::{PGRXSharedMemory, PgAtomic};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

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

thread_local! {
    /// Whether this process attached the segment (pg_shard was preloaded).
    static ATTACHED: Cell<bool> = const { Cell::new(false) };
    /// This node's generator number, read once per backend (None: not read).
    static GENERATOR: Cell<Option<Option<i32>>> = const { Cell::new(None) };
}

/// Requests the shared memory; from `_PG_init` while
/// shared_preload_libraries are loaded.
// (The macro tests features of other PostgreSQL versions than ours.)
#[allow(unexpected_cfgs)]
pub(crate) fn register_shared_memory() {
    pgrx::pg_shmem_init!(CLOCKS = Clocks::new());
}

/// Forget the cached generator number (relcache invalidation: add_node
/// records it with one).
pub(crate) fn forget() {
    GENERATOR.set(None);
}

/// The next clock position for `prefix`: the later of now and the last one
/// plus one, taken atomically.
pub(crate) fn next_position(prefix: u16) -> Result<u64> {
    if !ATTACHED.get() {
        // The segment exists only when pg_shard was preloaded.
        if !preloaded() {
            return Err(ShardError::InvalidArgument(
                "pg_shard.next_id needs pg_shard in shared_preload_libraries".into(),
            ));
        }
        ATTACHED.set(true);
    }
    let slot = &CLOCKS.get().positions[prefix as usize % PREFIXES];
    let now_ms = wall_clock_ms() - routing_id::EPOCH_MS;
    let mut last = slot.load(Ordering::Relaxed);
    loop {
        let next = routing_id::next_position(last, now_ms);
        match slot.compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Ok(next),
            Err(current) => last = current,
        }
    }
}

/// Whether this library was loaded through shared_preload_libraries.
fn preloaded() -> bool {
    // SAFETY: reads a GUC string owned by the GUC machinery.
    let libraries = unsafe {
        let value = pg_sys::GetConfigOption(c"shared_preload_libraries".as_ptr(), true, false);
        if value.is_null() {
            return false;
        }
        std::ffi::CStr::from_ptr(value)
            .to_string_lossy()
            .into_owned()
    };
    libraries.split(',').any(|l| l.trim() == "pg_shard")
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
