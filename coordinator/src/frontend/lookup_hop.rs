//! The first hop of a read by a looked-up column
//! ([`crate::router::LookupHop`]): the lookup's shard is read over a
//! pooled connection of the client's role, outside any transaction, and
//! the statement is then routed by the keyspace ids it gave.

use super::Session;
use crate::backend::cluster::ClusterMap;
use crate::backend::pool::PoolKey;
use crate::router::LookupHop;
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
        connection.send_query(&hop.sql).await.ok()?;
        let answer = connection.read_answer().await.ok()?;
        if answer.error.is_some() {
            return None;
        }
        self.shared.metrics.shard(hop.shard);
        answer
            .first_values
            .iter()
            .map(|value| value.as_deref()?.parse().ok())
            .collect()
    }
}
