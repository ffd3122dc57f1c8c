//! A split's verification before its cutover: the halves, with
//! everything applied up to a point of the source's WAL, against the
//! source's snapshot of that point ([`crate::operations::verification`]).

use super::apply::{self, Apply, Direction};
use super::tables::{Ranges, SplitTable};
use crate::error::Result;
use crate::operations::job::{Job, Next};
use crate::operations::node_access::connect;
use crate::operations::node_access::run_on;
use crate::operations::verification::{
    begin_snapshot, comparable_output, compare, digest, finish, lock_briefly,
};
use std::time::Instant;

/// A split's verification: the halves with everything applied up to the
/// point, against the source's snapshot of it.
pub(super) fn verify_split(job: &Job, tables: &[SplitTable]) -> Result<Next> {
    let started = Instant::now();
    let ranges = Ranges::load(job)?;
    let sources: Vec<String> = tables.iter().map(|t| t.source.qualified()).collect();
    // Every connection first: none is opened while writers wait. Both
    // sides are read with the same output settings.
    let mut source = connect(&job.source)?;
    let mut node = apply::connection(job)?;
    comparable_output(&job.source, &mut source)?;
    comparable_output(&job.source, &mut node)?;
    let Some(mut lock_holder) = lock_briefly(&job.source, &sources)? else {
        return Ok(Next::Stay);
    };
    begin_snapshot(&job.source, &mut source)?;
    let point = apply::flushed_position(job, &mut node)?;
    run_on(&job.source, &mut lock_holder, "COMMIT")?;
    drop(lock_holder);
    let forward = Apply {
        job,
        tables,
        ranges: &ranges,
        direction: Direction::Forward,
    };
    forward.up_to(
        &mut node,
        point,
        "the changes before the verification point were",
    )?;
    // Nothing else writes the halves, and the job applies no further until
    // this step is over.
    let range = (ranges.range_start, ranges.range_end);
    let mut differences = Vec::new();
    let mut rows = 0;
    for table in tables {
        let column = table.source.dist_column.as_deref();
        let from = table.source.qualified();
        let halves = format!(
            "(SELECT * FROM {} UNION ALL SELECT * FROM {})",
            table.qualified(&table.lower),
            table.qualified(&table.upper)
        );
        let on_source = digest(&job.source, &mut source, &from, column, range)?;
        let in_halves = digest(&job.source, &mut node, &halves, column, range)?;
        rows += on_source.values().map(|(count, _)| count).sum::<i64>();
        differences.extend(compare(&from, range, &on_source, &in_halves, "halves"));
    }
    run_on(&job.source, &mut source, "COMMIT")?;
    finish(job, differences, rows, started)
}
