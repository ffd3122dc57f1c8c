//! The DBA's commands on the metadata node and the statements it carries to
//! the shards: distributing and undistributing tables, adding nodes,
//! DROP TABLE, writes to reference tables, lookup tables ([`lookup`]), and
//! schema changes ([`ddl`]).

pub(crate) mod copy_from;
pub(crate) mod ddl;
pub(crate) mod distribute;
pub(crate) mod drop;
pub(crate) mod isolate;
pub(crate) mod lookup;
pub(crate) mod nodes;
pub(crate) mod reference;
pub(crate) mod routing_id;
pub(crate) mod undistribute;
