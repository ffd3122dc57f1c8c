//! Rows a node sends as text, turned into the scan's tuples (its types'
//! input functions) and kept in a tuplestore, which spills to disk beyond
//! `work_mem`: nothing a result holds stays in memory, and the connection
//! is free again as soon as its statement ends.

use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::transaction::connection::TextRow;
use pgrx::prelude::*;
use pgrx::PgMemoryContexts;
use std::ffi::{c_char, CStr, CString};

pub(crate) struct RowStore {
    store: *mut pg_sys::Tuplestorestate,
    descriptor: pg_sys::TupleDesc,
    inputs: Vec<(pg_sys::FmgrInfo, pg_sys::Oid, i32)>,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
    row_context: PgMemoryContexts,
}

impl RowStore {
    /// A store of tuples of `descriptor`, in the current memory context.
    ///
    /// # Safety
    /// `descriptor` outlives the store (the scan's slot's).
    pub(crate) unsafe fn new(descriptor: pg_sys::TupleDesc) -> RowStore {
        // SAFETY: a valid descriptor; catalog lookups of its types.
        unsafe {
            let columns = (*descriptor).natts as usize;
            let mut inputs = Vec::with_capacity(columns);
            for i in 0..columns {
                let attribute = (*descriptor).attrs.as_ptr().add(i);
                let mut function = pg_sys::InvalidOid;
                let mut io_param = pg_sys::InvalidOid;
                pg_sys::getTypeInputInfo((*attribute).atttypid, &mut function, &mut io_param);
                let mut info = pg_sys::FmgrInfo::default();
                pg_sys::fmgr_info(function, &mut info);
                inputs.push((info, io_param, (*attribute).atttypmod));
            }
            RowStore {
                store: pg_sys::tuplestore_begin_heap(false, false, pg_sys::work_mem),
                descriptor,
                inputs,
                values: vec![pg_sys::Datum::from(0usize); columns],
                nulls: vec![false; columns],
                row_context: PgMemoryContexts::new("pg_shard worker row"),
            }
        }
    }

    /// Store one row `node` sent.
    pub(crate) fn put(&mut self, row: &TextRow<'_>, node: &Node) -> Result<()> {
        self.put_texts(row.len(), |i| row.c_str(i), node)
    }

    /// Store one row `node` sent, kept as its columns' texts.
    pub(crate) fn put_kept(&mut self, row: &[Option<CString>], node: &Node) -> Result<()> {
        self.put_texts(row.len(), |i| row.get(i).and_then(|c| c.as_deref()), node)
    }

    /// Store a row of `length` columns whose texts `column` gives (None
    /// for NULL).
    fn put_texts<'r>(
        &mut self,
        length: usize,
        column: impl Fn(usize) -> Option<&'r CStr>,
        node: &Node,
    ) -> Result<()> {
        let columns = self.inputs.len();
        if length != columns {
            return Err(ShardError::Internal(format!(
                "node {} returned {length} columns for a statement of {columns}",
                node.label(),
            )));
        }
        let RowStore {
            store,
            descriptor,
            inputs,
            values,
            nulls,
            row_context,
        } = self;
        // SAFETY: input functions of the descriptor's types, run in a
        // context reset for every row; the tuplestore copies the tuple.
        unsafe {
            row_context.reset();
            row_context.switch_to(|_| {
                for (i, (info, io_param, typmod)) in inputs.iter_mut().enumerate() {
                    match column(i) {
                        None => {
                            nulls[i] = true;
                            values[i] = pg_sys::Datum::from(0usize);
                        }
                        Some(text) => {
                            nulls[i] = false;
                            values[i] = pg_sys::InputFunctionCall(
                                info,
                                text.as_ptr() as *mut c_char,
                                *io_param,
                                *typmod,
                            );
                        }
                    }
                }
                pg_sys::tuplestore_putvalues(
                    *store,
                    *descriptor,
                    values.as_mut_ptr(),
                    nulls.as_mut_ptr(),
                );
            });
        }
        Ok(())
    }

    /// The tuplestore, which the scan now owns (and ends).
    pub(crate) fn into_tuplestore(self) -> *mut pg_sys::Tuplestorestate {
        self.store
    }
}
