//! Classes of small dense indexes known to be equal (range table entries
//! whose distribution columns are tied by `=`, columns of a statement): a
//! union-find that both the extension's planner and the coordinator's
//! router use to decide which relations share a key.

/// A union-find over indexes `0..`; an index not seen yet is a class of its
/// own.
#[derive(Debug, Default, Clone)]
pub struct UnionFind {
    parent: Vec<usize>,
}

impl UnionFind {
    /// The class of `index` (its root: the same for all indexes joined).
    pub fn root(&mut self, index: usize) -> usize {
        if index >= self.parent.len() {
            let start = self.parent.len();
            self.parent.extend(start..=index);
            return index;
        }
        let mut member = index;
        while self.parent[member] != member {
            // Path halving: later lookups take fewer steps.
            self.parent[member] = self.parent[self.parent[member]];
            member = self.parent[member];
        }
        member
    }

    /// Joins the classes of `a` and `b`; returns the root that was merged
    /// away and the root that remains, or None when they were one class.
    pub fn join(&mut self, a: usize, b: usize) -> Option<(usize, usize)> {
        let (a, b) = (self.root(a), self.root(b));
        if a == b {
            return None;
        }
        self.parent[a] = b;
        Some((a, b))
    }

    /// A new index, a class of its own.
    pub fn push(&mut self) -> usize {
        self.parent.push(self.parent.len());
        self.parent.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::UnionFind;

    #[test]
    fn joins_are_transitive_and_unseen_indexes_stand_alone() {
        let mut classes = UnionFind::default();
        assert_eq!(classes.root(5), 5);
        assert_ne!(classes.root(1), classes.root(2));
        assert_eq!(classes.join(1, 2), Some((1, 2)));
        assert_eq!(classes.join(2, 7).map(|(_, kept)| kept), Some(7));
        assert_eq!(classes.root(1), classes.root(7));
        assert_eq!(classes.join(7, 1), None);
        assert_ne!(classes.root(1), classes.root(3));
        let fresh = classes.push();
        assert_eq!(fresh, 8);
        assert_eq!(classes.root(fresh), fresh);
    }
}
