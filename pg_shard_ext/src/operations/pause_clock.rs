//! Where a cutover's write pause goes: the time from the start of the
//! cutover's lock to each of its steps, recorded with the new map version
//! in the job's `resources.cutover_ms` (the map is public once the
//! runner's transaction commits, right after).

use super::job::Job;
use crate::error::Result;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub(crate) struct PauseClock {
    started: Instant,
    /// The start on the wall clock, which a node's clock on this host
    /// shares.
    started_wall: SystemTime,
    steps: Vec<(&'static str, f64)>,
}

impl PauseClock {
    pub(crate) fn start() -> PauseClock {
        PauseClock {
            started: Instant::now(),
            started_wall: SystemTime::now(),
            steps: Vec::new(),
        }
    }

    /// `step` was done at `unix_micros`, a node's clock (nodes on this
    /// host share it: in one round trip, the lock's moment); ignored when
    /// the clocks disagree.
    pub(crate) fn mark_at(&mut self, step: &'static str, unix_micros: Option<i64>) {
        let Some(micros) = unix_micros else { return };
        let at = UNIX_EPOCH + std::time::Duration::from_micros(micros.max(0) as u64);
        if let Ok(since) = at.duration_since(self.started_wall) {
            let ms = since.as_secs_f64() * 1000.0;
            self.steps.push((step, (ms * 10.0).round() / 10.0));
        }
    }

    /// `step` is done: milliseconds since the start.
    pub(crate) fn mark(&mut self, step: &'static str) {
        let ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.steps.push((step, (ms * 10.0).round() / 10.0));
    }

    fn as_json(&self) -> String {
        let fields: Vec<String> = self
            .steps
            .iter()
            .map(|(step, ms)| format!("\"{step}\": {ms}"))
            .collect();
        format!("{{{}}}", fields.join(", "))
    }
}

/// The new map version and the pause's steps, in the job's resources
/// under `version_key` and `pause_key` (a cutover's, or a revert's).
pub(crate) fn record_publish(
    job: &Job,
    (version_key, version): (&str, i64),
    (pause_key, pause): (&str, &PauseClock),
) -> Result<()> {
    crate::spi::run_with_args(
        "UPDATE pg_shard.job SET resources = resources \
             || jsonb_build_object($2::text, $3::bigint, $4::text, $5::jsonb) \
         WHERE job_id = $1",
        &[
            job.job_id.into(),
            version_key.into(),
            version.into(),
            pause_key.into(),
            pause.as_json().into(),
        ],
    )?;
    Ok(())
}
