//! `COPY table [(columns)] FROM STDIN | TO STDOUT [WITH (options)]`: what
//! the coordinator needs to split the rows by key and stream each share
//! into its shard tables, or to stream a table out of its shards. Options
//! it does not read (FREEZE, ENCODING, FORCE_*, WHERE, …) leave the
//! statement to the metadata node.

use super::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyFormat {
    Text,
    Csv,
    Binary,
}

/// A COPY FROM STDIN (or TO STDOUT) the coordinator can split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyIn {
    /// TO STDOUT.
    pub out: bool,
    pub schema: Option<String>,
    pub name: String,
    /// The column list as written; None: every column, in order.
    pub columns: Option<Vec<String>>,
    pub format: CopyFormat,
    pub delimiter: u8,
    pub quote: u8,
    pub escape: u8,
    /// The NULL string (text and CSV).
    pub null: String,
    /// CSV HEADER: the first line is not a row.
    pub header: bool,
}

impl CopyIn {
    /// The COPY that loads rows of this copy into one shard table (the
    /// header, if any, stays with the coordinator).
    pub fn shard_statement(&self, shard_table: &str) -> String {
        self.shard_statement_with(shard_table, false)
    }

    /// The COPY for one shard table, in the copy's direction; `header`: a
    /// CSV header line (only the first shard of a COPY TO sends one).
    pub fn shard_statement_with(&self, shard_table: &str, header: bool) -> String {
        let columns = self.columns.as_ref().map_or(String::new(), |columns| {
            let names: Vec<String> = columns.iter().map(|c| quote::ident(c)).collect();
            format!(" ({})", names.join(", "))
        });
        let options = match self.format {
            CopyFormat::Binary => "FORMAT binary".to_string(),
            CopyFormat::Text => format!(
                "FORMAT text, DELIMITER {}, NULL {}",
                quote::literal(&(self.delimiter as char).to_string()),
                quote::literal(&self.null)
            ),
            CopyFormat::Csv => format!(
                "FORMAT csv, DELIMITER {}, NULL {}, QUOTE {}, ESCAPE {}",
                quote::literal(&(self.delimiter as char).to_string()),
                quote::literal(&self.null),
                quote::literal(&(self.quote as char).to_string()),
                quote::literal(&(self.escape as char).to_string())
            ),
        };
        let (direction, header) = match (self.out, header) {
            (false, _) => ("FROM STDIN", ""),
            (true, false) => ("TO STDOUT", ""),
            (true, true) => ("TO STDOUT", ", HEADER"),
        };
        format!("COPY {shard_table}{columns} {direction} WITH ({options}{header})")
    }
}

/// Reads a COPY FROM STDIN statement (None for anything else, or for
/// options the coordinator leaves to the metadata node).
#[cfg(test)]
pub fn copy_in(sql: &str) -> Option<CopyIn> {
    copy_statement(sql).filter(|copy| !copy.out)
}

/// Reads a COPY table TO STDOUT statement, as [`copy_in`].
#[cfg(test)]
pub fn copy_out(sql: &str) -> Option<CopyIn> {
    copy_statement(sql).filter(|copy| copy.out)
}

/// Reads a COPY table FROM STDIN or TO STDOUT (None for anything else, or
/// for options the coordinator leaves to the metadata node).
pub fn copy_statement(sql: &str) -> Option<CopyIn> {
    let parsed = pg_query::parse(sql).ok()?;
    let [statement] = parsed.protobuf.stmts.as_slice() else {
        return None;
    };
    let N::CopyStmt(copy) = statement.stmt.as_ref()?.node.as_ref()? else {
        return None;
    };
    if copy.is_program || !copy.filename.is_empty() || copy.query.is_some() {
        return None;
    }
    if copy.where_clause.is_some() {
        return None;
    }
    let relation = copy.relation.as_ref()?;
    if relation.relpersistence == "t" || !relation.catalogname.is_empty() {
        return None;
    }
    let columns = if copy.attlist.is_empty() {
        None
    } else {
        let mut names = Vec::with_capacity(copy.attlist.len());
        for column in &copy.attlist {
            match column.node.as_ref()? {
                N::String(name) => names.push(name.sval.clone()),
                _ => return None,
            }
        }
        Some(names)
    };
    let mut format = CopyFormat::Text;
    let (mut delimiter, mut null, mut quote, mut escape) = (None, None, None, None);
    let mut header = false;
    for option in &copy.options {
        let N::DefElem(option) = option.node.as_ref()? else {
            return None;
        };
        let value = match option.arg.as_ref().and_then(|arg| arg.node.as_ref()) {
            None => None,
            Some(N::String(text)) => Some(text.sval.clone()),
            Some(N::Boolean(flag)) => Some(if flag.boolval { "true" } else { "false" }.into()),
            Some(N::Integer(number)) => Some(number.ival.to_string()),
            Some(_) => return None,
        };
        match option.defname.as_str() {
            "format" => {
                format = match value?.to_ascii_lowercase().as_str() {
                    "text" => CopyFormat::Text,
                    "csv" => CopyFormat::Csv,
                    "binary" => CopyFormat::Binary,
                    _ => return None,
                }
            }
            "delimiter" => delimiter = Some(single_byte(&value?)?),
            "quote" => quote = Some(single_byte(&value?)?),
            "escape" => escape = Some(single_byte(&value?)?),
            "null" => null = Some(value?),
            "header" => {
                header = match value.as_deref().map(str::to_ascii_lowercase).as_deref() {
                    None | Some("true" | "on" | "1") => true,
                    Some("false" | "off" | "0") => false,
                    // HEADER MATCH checks the names: the metadata node does.
                    _ => return None,
                }
            }
            _ => return None,
        }
    }
    let csv = format == CopyFormat::Csv;
    if (format == CopyFormat::Binary
        && (delimiter.is_some() || null.is_some() || header || quote.is_some()))
        || (!csv && (quote.is_some() || escape.is_some() || header))
    {
        // Let the server word the error.
        return None;
    }
    let quote = quote.unwrap_or(b'"');
    let delimiter = delimiter.unwrap_or(if csv { b',' } else { b'\t' });
    if delimiter == b'\n' || delimiter == b'\r' || (csv && delimiter == quote) {
        return None;
    }
    Some(CopyIn {
        out: !copy.is_from,
        schema: (!relation.schemaname.is_empty()).then(|| relation.schemaname.clone()),
        name: relation.relname.clone(),
        columns,
        format,
        delimiter,
        quote,
        escape: escape.unwrap_or(quote),
        null: null.unwrap_or_else(|| if csv { String::new() } else { "\\N".into() }),
        header,
    })
}

/// A one-byte (ASCII) option value, as COPY requires.
fn single_byte(value: &str) -> Option<u8> {
    match value.as_bytes() {
        [byte] if byte.is_ascii() => Some(*byte),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_it_can_split() {
        let plain = copy_in("COPY accounts FROM STDIN").unwrap();
        assert_eq!(plain.format, CopyFormat::Text);
        assert_eq!((plain.delimiter, plain.null.as_str()), (b'\t', "\\N"));
        let csv = copy_in(
            "COPY app.accounts (aid, \"Bal\") FROM STDIN WITH (FORMAT csv, HEADER, DELIMITER ';')",
        )
        .unwrap();
        assert_eq!(csv.schema.as_deref(), Some("app"));
        assert_eq!(
            csv.columns,
            Some(vec!["aid".to_string(), "Bal".to_string()])
        );
        assert!(csv.header);
        assert_eq!((csv.delimiter, csv.quote, csv.escape), (b';', b'"', b'"'));
        assert_eq!(csv.null, "");
        assert_eq!(
            csv.shard_statement("\"app\".\"accounts_7\""),
            "COPY \"app\".\"accounts_7\" (\"aid\", \"Bal\") FROM STDIN WITH (FORMAT csv, DELIMITER ';', NULL '', QUOTE '\"', ESCAPE '\"')"
        );
        assert_eq!(
            copy_in("COPY t FROM STDIN (FORMAT binary)").unwrap().format,
            CopyFormat::Binary
        );
        assert_eq!(
            copy_in("COPY t FROM STDIN CSV").unwrap().format,
            CopyFormat::Csv
        );
        let out = copy_out("COPY t (a) TO STDOUT WITH (FORMAT csv, HEADER)").unwrap();
        assert!(out.header);
        assert_eq!(
            out.shard_statement_with("t_1", true),
            "COPY t_1 (\"a\") TO STDOUT WITH (FORMAT csv, DELIMITER ',', NULL '', QUOTE '\"', ESCAPE '\"', HEADER)"
        );
        assert_eq!(copy_in("COPY t TO STDOUT"), None);
        assert_eq!(copy_out("COPY t FROM STDIN"), None);
    }

    #[test]
    fn leaves_the_rest_to_the_metadata_node() {
        for sql in [
            "COPY t FROM '/tmp/file'",
            "COPY t FROM STDIN WITH (FREEZE)",
            "COPY t FROM STDIN WITH (FORMAT csv, HEADER MATCH)",
            "COPY t FROM STDIN WITH (ENCODING 'LATIN1')",
            "COPY t FROM STDIN WHERE a > 1",
            "COPY t FROM STDIN WITH (FORMAT binary, HEADER)",
            "COPY t FROM STDIN WITH (DELIMITER ';;')",
            "COPY (SELECT 1) TO STDOUT",
            "COPY t FROM STDIN; SELECT 1",
        ] {
            assert_eq!(copy_in(sql), None, "{sql}");
        }
    }
}
