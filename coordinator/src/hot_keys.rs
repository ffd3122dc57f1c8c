//! Hot keys: the statements routed per keyspace id of each table, counted
//! with the space-saving top-k sketch (Metwally, Agrawal, El Abbadi 2005)
//! in bounded memory: [`CAPACITY`] counters per table, for at most
//! [`MAX_TABLES`] tables per database. A key seen while every counter is
//! taken replaces the smallest count `m` and starts at `m + 1` with error
//! `m`, so a key with more than `total / CAPACITY` statements is always
//! among the counters, and each count overestimates by at most its error.
//! Counts halve every [`HALF_LIFE`], so the shares are those of recent
//! traffic.

use pg_shard_core::KeyspaceId;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Counters per table.
pub const CAPACITY: usize = 64;
/// Tables counted per database; statements on others are not counted.
pub const MAX_TABLES: usize = 1024;
/// Longest key text kept (longer keys are cut, marked with `…`).
const MAX_KEY_TEXT: usize = 200;
pub const HALF_LIFE: Duration = Duration::from_secs(60);

/// One table's sketch.
#[derive(Debug, Default)]
pub struct SpaceSaving {
    entries: Vec<Counter>,
    index: HashMap<KeyspaceId, usize>,
    /// Statements counted (decayed like the counts).
    total: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    pub id: KeyspaceId,
    /// The key as the statement gave it (text form).
    pub key: String,
    pub count: u64,
    /// How much of `count` may belong to keys it replaced.
    pub error: u64,
}

impl SpaceSaving {
    /// Counts one statement for `id`; `key` gives its text when a counter
    /// is (re)assigned to it.
    pub fn observe(&mut self, id: KeyspaceId, key: impl FnOnce() -> String) {
        self.total += 1;
        if let Some(&at) = self.index.get(&id) {
            self.entries[at].count += 1;
            return;
        }
        if self.entries.len() < CAPACITY {
            self.index.insert(id, self.entries.len());
            self.entries.push(Counter {
                id,
                key: clip(key()),
                count: 1,
                error: 0,
            });
            return;
        }
        let Some((at, smallest)) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.count)
            .map(|(at, c)| (at, c.count))
        else {
            return;
        };
        self.index.remove(&self.entries[at].id);
        self.index.insert(id, at);
        self.entries[at] = Counter {
            id,
            key: clip(key()),
            count: smallest + 1,
            error: smallest,
        };
    }

    /// Halves every count (and the total); counters that reach 0 go.
    pub fn decay(&mut self) {
        self.total /= 2;
        for counter in &mut self.entries {
            counter.count /= 2;
            counter.error /= 2;
        }
        self.entries.retain(|c| c.count > 0);
        self.index = self
            .entries
            .iter()
            .enumerate()
            .map(|(at, c)| (c.id, at))
            .collect();
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// The `n` largest counters, largest first.
    pub fn top(&self, n: usize) -> Vec<Counter> {
        let mut top = self.entries.clone();
        top.sort_by(|a, b| b.count.cmp(&a.count).then(a.id.cmp(&b.id)));
        top.truncate(n);
        top
    }
}

fn clip(mut key: String) -> String {
    if key.len() > MAX_KEY_TEXT {
        let mut end = MAX_KEY_TEXT;
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        key.truncate(end);
        key.push('…');
    }
    key
}

/// A hot key as SHOW HOT_KEYS, /metrics and the reports show it.
#[derive(Debug, Clone, PartialEq)]
pub struct HotKey {
    pub database: String,
    pub schema: String,
    pub table: String,
    pub counter: Counter,
    /// The table's statements counted (decayed), the share's denominator.
    pub table_total: u64,
}

impl HotKey {
    /// count / table_total.
    pub fn share(&self) -> f64 {
        if self.table_total == 0 {
            0.0
        } else {
            self.counter.count as f64 / self.table_total as f64
        }
    }
}

type Tables = HashMap<String, HashMap<String, SpaceSaving>>;

/// The sketches of every database and table.
pub struct HotKeys {
    state: Mutex<State>,
}

struct State {
    /// database → schema → table → sketch.
    databases: HashMap<String, Tables>,
    decayed_at: Instant,
}

impl State {
    /// Halves every count once per half-life gone by (traffic or not), and
    /// forgets tables whose counts reached nothing (dropped or idle ones
    /// free their place among MAX_TABLES).
    fn age(&mut self) {
        let elapsed = self.decayed_at.elapsed();
        let halvings = (elapsed.as_secs_f64() / HALF_LIFE.as_secs_f64()) as u32;
        if halvings == 0 {
            return;
        }
        self.decayed_at += HALF_LIFE * halvings;
        for tables in self.databases.values_mut() {
            for sketches in tables.values_mut() {
                for sketch in sketches.values_mut() {
                    // 64 halvings leave nothing of a u64.
                    for _ in 0..halvings.min(64) {
                        sketch.decay();
                    }
                }
                sketches.retain(|_, sketch| sketch.total() > 0);
            }
            tables.retain(|_, sketches| !sketches.is_empty());
        }
        self.databases.retain(|_, tables| !tables.is_empty());
    }
}

impl Default for HotKeys {
    fn default() -> Self {
        HotKeys {
            state: Mutex::new(State {
                databases: HashMap::new(),
                decayed_at: Instant::now(),
            }),
        }
    }
}

impl HotKeys {
    /// Counts a statement routed by key `id` of `schema.table`.
    pub fn observe(
        &self,
        database: &str,
        schema: &str,
        table: &str,
        id: KeyspaceId,
        key: impl FnOnce() -> String,
    ) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        state.age();
        let tables = match state.databases.get_mut(database) {
            Some(tables) => tables,
            None => state.databases.entry(database.to_owned()).or_default(),
        };
        if let Some(sketch) = tables.get_mut(schema).and_then(|t| t.get_mut(table)) {
            sketch.observe(id, key);
            return;
        }
        let counted: usize = tables.values().map(HashMap::len).sum();
        if counted >= MAX_TABLES {
            return;
        }
        let mut sketch = SpaceSaving::default();
        sketch.observe(id, key);
        tables
            .entry(schema.to_owned())
            .or_default()
            .insert(table.to_owned(), sketch);
    }

    /// The `per_table` hottest keys of every table (of `database`, or all),
    /// by share, largest first.
    pub fn hottest(&self, database: Option<&str>, per_table: usize) -> Vec<HotKey> {
        let Ok(mut state) = self.state.lock() else {
            return Vec::new();
        };
        state.age();
        let mut hot = Vec::new();
        for (db, tables) in &state.databases {
            if database.is_some_and(|d| d != db) {
                continue;
            }
            for (schema, sketches) in tables {
                for (table, sketch) in sketches {
                    for counter in sketch.top(per_table) {
                        hot.push(HotKey {
                            database: db.clone(),
                            schema: schema.clone(),
                            table: table.clone(),
                            counter,
                            table_total: sketch.total(),
                        });
                    }
                }
            }
        }
        hot.sort_by(|a, b| {
            b.share().total_cmp(&a.share()).then_with(|| {
                (&a.database, &a.schema, &a.table).cmp(&(&b.database, &b.schema, &b.table))
            })
        });
        hot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> KeyspaceId {
        KeyspaceId(n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    #[test]
    fn heavy_hitters_are_found_with_bounded_error() {
        let mut sketch = SpaceSaving::default();
        // 10,000 statements: key 1 a third, key 2 a tenth, the rest spread
        // over 5,000 keys.
        let mut n = 0u64;
        let (mut ones, mut twos) = (0u64, 0u64);
        for i in 0..10_000u64 {
            let key = match i % 30 {
                0..=9 => {
                    ones += 1;
                    1
                }
                10..=12 => {
                    twos += 1;
                    2
                }
                _ => {
                    n += 1;
                    1000 + n % 5000
                }
            };
            sketch.observe(id(key), || key.to_string());
        }
        assert_eq!(sketch.total(), 10_000);
        let top = sketch.top(2);
        assert_eq!(top[0].key, "1");
        assert_eq!(top[1].key, "2");
        // counts never underestimate, and overestimate by at most error
        assert!(top[0].count >= ones && top[0].count - top[0].error <= ones);
        assert!(top[1].count >= twos && top[1].count - top[1].error <= twos);
        // the error is at most total / CAPACITY
        assert!(top[0].error <= 10_000 / CAPACITY as u64);
        assert!(sketch.entries.len() <= CAPACITY);
    }

    #[test]
    fn decay_halves_and_forgets() {
        let mut sketch = SpaceSaving::default();
        for _ in 0..4 {
            sketch.observe(id(1), || "1".into());
        }
        sketch.observe(id(2), || "2".into());
        sketch.decay();
        assert_eq!(sketch.total(), 2);
        assert_eq!(sketch.top(5).len(), 1);
        sketch.observe(id(2), || "2".into());
        assert_eq!(sketch.top(5)[1].count, 1);
    }

    #[test]
    fn idle_time_ages_the_counts_and_frees_tables() {
        let hot = HotKeys::default();
        for _ in 0..8 {
            hot.observe("db", "public", "t", id(1), || "1".into());
        }
        if let Ok(mut state) = hot.state.lock() {
            // Two half-lives ago, with no statement since.
            state.decayed_at -= HALF_LIFE * 2;
        }
        let aged = hot.hottest(Some("db"), 1);
        assert_eq!((aged[0].counter.count, aged[0].table_total), (2, 2));
        if let Ok(mut state) = hot.state.lock() {
            state.decayed_at -= HALF_LIFE * 3;
        }
        assert!(hot.hottest(Some("db"), 1).is_empty());
        assert!(hot
            .state
            .lock()
            .map(|s| s.databases.is_empty())
            .unwrap_or(false));
    }

    #[test]
    fn tables_are_bounded_and_shares_computed() {
        let hot = HotKeys::default();
        for t in 0..(MAX_TABLES + 10) {
            hot.observe("db", "public", &format!("t{t}"), id(1), || "1".into());
        }
        hot.observe("db", "public", "t0", id(2), || "2".into());
        let all = hot.hottest(Some("db"), 1);
        assert_eq!(all.len(), MAX_TABLES);
        let t0 = all.iter().find(|h| h.table == "t0").unwrap();
        assert_eq!((t0.counter.count, t0.table_total), (1, 2));
        assert!((t0.share() - 0.5).abs() < 1e-9);
        assert!(hot.hottest(Some("other"), 1).is_empty());
        assert_eq!(clip("é".repeat(150)).chars().count(), 101);
    }
}
