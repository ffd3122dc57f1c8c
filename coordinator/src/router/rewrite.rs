//! The statement text with each table's name replaced by its shard's.

use super::*;

/// The statement with each relation's name replaced by `names[i]`, keeping
/// the name the rest of the statement uses for it as an alias.
pub(super) fn rewrite(
    sql: &str,
    normalized: &Normalized,
    relations: &[Relation],
    names: &[String],
) -> Option<String> {
    let mut edits: Vec<(usize, usize, &Relation, &String)> = relations
        .iter()
        .zip(names)
        .map(|(relation, name)| {
            (
                normalized.original_position(relation.span.0),
                normalized.original_position(relation.span.1),
                relation,
                name,
            )
        })
        .collect();
    edits.sort_by_key(|(start, ..)| *start);
    let mut out = String::with_capacity(sql.len() + 64);
    let mut at = 0;
    for (start, end, relation, name) in edits {
        if start < at || end < start {
            return None;
        }
        out.push_str(sql.get(at..start)?);
        out.push_str(name);
        if relation.alias.is_none() {
            out.push_str(" AS ");
            out.push_str(&quote::ident(&relation.name));
        }
        at = end;
    }
    out.push_str(sql.get(at..)?);
    Some(out)
}
