//! PostgreSQL's connection limits of roles and databases (`CONNECTION
//! LIMIT`: `rolconnlimit`, `datconnlimit`) applied to the coordinator's
//! clients: the servers only see the pooled connections, so the
//! coordinator counts its clients itself and refuses one past a limit with
//! the server's own error. Superusers are exempt, as on the server.

use crate::net::protocol::ServerError;
use crate::net::sqlstate;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a client at a limit waits for one that is leaving: a client
/// that closed its connection may still be counted for a moment (its
/// session ends after its Terminate arrives), and a client that connects
/// again at once would otherwise be refused where the server, whose new
/// backend takes longer to start, lets it in.
pub const LEAVING_GRACE: Duration = Duration::from_millis(250);

#[derive(Default)]
pub struct ClientCounts {
    roles: Mutex<HashMap<String, usize>>,
    databases: Mutex<HashMap<String, usize>>,
}

/// A counted client; counted no more once dropped.
pub struct Admitted {
    counts: Arc<ClientCounts>,
    role: String,
    database: String,
}

/// The limits that apply to a login (-1: none), as the metadata node has
/// them.
pub struct Limits {
    pub role: i64,
    pub database: i64,
    pub superuser: bool,
}

impl Limits {
    /// Neither limit holds this login back.
    pub fn none_apply(&self) -> bool {
        self.superuser || (self.role < 0 && self.database < 0)
    }
}

impl ClientCounts {
    /// Counts a client of `role` in `database`, or refuses it (53300) when
    /// that would pass the role's or the database's limit.
    pub fn admit(
        self: &Arc<Self>,
        role: &str,
        database: &str,
        limits: &Limits,
    ) -> Result<Admitted, ServerError> {
        let mut roles = self.roles.lock().unwrap_or_else(|e| e.into_inner());
        let mut databases = self.databases.lock().unwrap_or_else(|e| e.into_inner());
        let of_role = roles.get(role).copied().unwrap_or(0);
        let in_database = databases.get(database).copied().unwrap_or(0);
        let past = |limit: i64, count: usize| limit >= 0 && count as i64 >= limit;
        // In the server's order: the role first, then the database.
        if !limits.superuser && past(limits.role, of_role) {
            return Err(ServerError::fatal(
                sqlstate::TOO_MANY_CONNECTIONS,
                format!("too many connections for role \"{role}\""),
            ));
        }
        if !limits.superuser && past(limits.database, in_database) {
            return Err(ServerError::fatal(
                sqlstate::TOO_MANY_CONNECTIONS,
                format!("too many connections for database \"{database}\""),
            ));
        }
        *roles.entry(role.to_owned()).or_default() += 1;
        *databases.entry(database.to_owned()).or_default() += 1;
        Ok(Admitted {
            counts: self.clone(),
            role: role.to_owned(),
            database: database.to_owned(),
        })
    }

    /// [`Self::admit`], waiting up to [`LEAVING_GRACE`] for a client of the
    /// role or database to leave.
    pub async fn admit_waiting(
        self: &Arc<Self>,
        role: &str,
        database: &str,
        limits: &Limits,
    ) -> Result<Admitted, ServerError> {
        let deadline = Instant::now() + LEAVING_GRACE;
        loop {
            match self.admit(role, database, limits) {
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                admitted => return admitted,
            }
        }
    }

    #[cfg(test)]
    fn of_role(&self, role: &str) -> usize {
        self.roles.lock().unwrap().get(role).copied().unwrap_or(0)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let forget = |map: &Mutex<HashMap<String, usize>>, key: &str| {
            let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(count) = map.get_mut(key) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    map.remove(key);
                }
            }
        };
        forget(&self.counts.roles, &self.role);
        forget(&self.counts.databases, &self.database);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(role: i64, database: i64, superuser: bool) -> Limits {
        Limits {
            role,
            database,
            superuser,
        }
    }

    #[test]
    fn a_role_past_its_limit_is_refused_until_one_leaves() {
        let counts = Arc::new(ClientCounts::default());
        let first = counts.admit("app", "db", &limits(2, -1, false)).unwrap();
        let _second = counts.admit("app", "db", &limits(2, -1, false)).unwrap();
        let refused = counts
            .admit("app", "db", &limits(2, -1, false))
            .err()
            .unwrap();
        assert_eq!(refused.code, "53300");
        assert_eq!(refused.message, "too many connections for role \"app\"");
        // Another role, and a superuser, are not held back.
        assert!(counts.admit("other", "db", &limits(2, -1, false)).is_ok());
        assert!(counts.admit("app", "db", &limits(2, -1, true)).is_ok());
        drop(first);
        assert!(counts.admit("app", "db", &limits(2, -1, false)).is_ok());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_client_at_the_limit_waits_briefly_for_one_leaving() {
        let counts = Arc::new(ClientCounts::default());
        let leaving = counts.admit("app", "db", &limits(1, -1, false)).unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(leaving);
        });
        let started = Instant::now();
        let _admitted = counts
            .admit_waiting("app", "db", &limits(1, -1, false))
            .await
            .unwrap();
        assert!(started.elapsed() < LEAVING_GRACE);
        // Nobody leaves: refused once the grace is over.
        let started = Instant::now();
        let refused = counts
            .admit_waiting("app", "db", &limits(1, -1, false))
            .await
            .err()
            .unwrap();
        assert_eq!(refused.code, "53300");
        assert!(started.elapsed() >= LEAVING_GRACE);
    }

    #[test]
    fn a_database_past_its_limit_is_refused() {
        let counts = Arc::new(ClientCounts::default());
        let _kept = counts.admit("a", "db", &limits(-1, 1, false)).unwrap();
        let refused = counts
            .admit("b", "db", &limits(-1, 1, false))
            .err()
            .unwrap();
        assert_eq!(refused.message, "too many connections for database \"db\"");
        // The refused one was not counted.
        assert_eq!(counts.of_role("b"), 0);
    }
}
