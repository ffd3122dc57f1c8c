//! The first hop of a read by a looked-up column
//! ([`crate::router::LookupHop`]): the lookup's shard is read over a
//! pooled connection of the client's role, outside any transaction, and
//! the statement is then routed by the keyspace ids it gave.

use super::server_statements::server_statement_name;
use super::Session;
use crate::backend::cluster::ClusterMap;
use crate::backend::pool::PoolKey;
use crate::net::protocol;
use crate::router::LookupHop;
use bytes::{Bytes, BytesMut};
use std::time::Duration;

/// How long the hop waits for a free connection to the lookup's node
/// before the statement goes to the metadata node instead.
const CHECKOUT_WAIT: Duration = Duration::from_secs(5);

impl Session {
    /// The keyspace ids the lookup holds for the statement's value; None
    /// when they cannot be read (the statement then goes to the metadata
    /// node, which answers it all the same).
    pub(super) async fn look_up(&mut self, hop: &LookupHop, map: &ClusterMap) -> Option<Vec<i64>> {
        let address = map.nodes.get(&hop.node)?.address.clone();
        let pool = self.shared.pools.pool(&PoolKey {
            address,
            database: self.database.clone(),
            user: self.user.clone(),
        });
        let checkout = self.shared.pools.checkout_from(pool, self.serial);
        let mut lease = tokio::time::timeout(CHECKOUT_WAIT, checkout)
            .await
            .ok()?
            .ok()?;
        let connection = lease.connection();
        // Prepared on the connection the first time (named by its text,
        // as clients' statements are): later hops skip parsing and planning.
        let name = server_statement_name("lookup", &hop.sql, &[]);
        let parse = !connection.prepared.contains(&name);
        let mut request = BytesMut::new();
        if parse {
            protocol::parse(&mut request, &name, &hop.sql, &[]);
        }
        let bind = protocol::Bind {
            portal: String::new(),
            statement: name.clone(),
            parameter_formats: Vec::new(),
            parameters: vec![Some(Bytes::from(hop.value.clone()))],
            result_formats: Vec::new(),
        };
        bind.encode(&name, &mut request);
        protocol::execute(&mut request, "", 0);
        protocol::sync(&mut request);
        connection.write(&request).await.ok()?;
        let answer = connection.read_answer().await.ok()?;
        if answer.error.is_some() {
            // (A statement the server no longer has is prepared again.)
            connection.prepared.remove(&name);
            return None;
        }
        if parse {
            connection.prepared.insert(name);
        }
        self.shared.metrics.shard(&self.database, hop.shard);
        answer
            .first_values
            .iter()
            .map(|value| value.as_deref()?.parse().ok())
            .collect()
    }
}
