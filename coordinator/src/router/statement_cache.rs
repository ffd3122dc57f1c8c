//! Parsed statements by their text with literals taken out.

use crate::router::{self, lexer};
use lru::LruCache;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

/// Parsed statements by their text with literals taken out: a prepared
/// statement is parsed once, and so is a statement sent again and again
/// with other constants.
pub struct StatementCache {
    entries: Mutex<LruCache<String, Arc<router::Analysis>>>,
}

impl StatementCache {
    pub fn new(size: usize) -> StatementCache {
        StatementCache {
            entries: Mutex::new(LruCache::new(
                NonZeroUsize::new(size).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }

    /// The statement's analysis and its literals.
    pub fn get(&self, sql: &str) -> (Arc<router::Analysis>, lexer::Normalized) {
        let normalized = lexer::normalize(sql);
        if let Some(found) = self.lookup(&normalized.key) {
            return (found, normalized);
        }
        let analysis = router::analyze(&normalized.key);
        if matches!(analysis, router::Analysis::Unparsed) && normalized.key != sql {
            // A literal that may not become a parameter (`varchar(10)`):
            // the original text, cached as it is.
            let verbatim = lexer::normalize_nothing(sql);
            let analysis = self
                .lookup(sql)
                .unwrap_or_else(|| self.store(sql, router::analyze(sql)));
            return (analysis, verbatim);
        }
        (self.store(&normalized.key, analysis), normalized)
    }

    fn lookup(&self, key: &str) -> Option<Arc<router::Analysis>> {
        self.entries.lock().ok()?.get(key).cloned()
    }

    fn store(&self, key: &str, analysis: router::Analysis) -> Arc<router::Analysis> {
        let analysis = Arc::new(analysis);
        if let Ok(mut entries) = self.entries.lock() {
            entries.put(key.to_owned(), analysis.clone());
        }
        analysis
    }
}
