//! Columns known to hold equal values (`a.k = b.k` in a statement's
//! conditions), as classes: a union-find over (relation index, column).

use pg_shard_core::UnionFind;
use std::collections::HashMap;

#[derive(Default)]
pub(super) struct EquivalenceClasses {
    ids: HashMap<(usize, String), usize>,
    classes: UnionFind,
}

impl EquivalenceClasses {
    /// The id of `column` of relation `relation` (a class of its own until
    /// [`Self::join`]ed).
    pub(super) fn member(&mut self, relation: usize, column: &str) -> usize {
        let classes = &mut self.classes;
        *self
            .ids
            .entry((relation, column.to_owned()))
            .or_insert_with(|| classes.push())
    }

    /// The two members hold equal values.
    pub(super) fn join(&mut self, a: usize, b: usize) {
        self.classes.join(a, b);
    }

    /// The class of a member (the same for all members joined).
    pub(super) fn class(&mut self, member: usize) -> usize {
        self.classes.root(member)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joined_columns_share_a_class_transitively() {
        let mut classes = EquivalenceClasses::default();
        let a = classes.member(0, "id");
        let b = classes.member(1, "id");
        let c = classes.member(2, "owner");
        let d = classes.member(2, "id");
        assert_eq!(classes.member(0, "id"), a, "a member keeps its id");
        assert_ne!(classes.class(a), classes.class(b));
        classes.join(a, b);
        classes.join(b, c);
        assert_eq!(classes.class(a), classes.class(c));
        assert_ne!(classes.class(a), classes.class(d));
    }
}
