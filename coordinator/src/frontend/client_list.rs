//! The clients logged in, for SHOW CLIENTS: who, from where, over TLS or
//! not, since when. Entries come and go with the sessions (startup.rs).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

pub struct ClientEntry {
    pub user: String,
    pub database: String,
    pub peer: Option<SocketAddr>,
    /// Protocol and cipher (`TLSv1.3/TLS13_AES_256_GCM_SHA384`); None: plain.
    pub tls: Option<String>,
    pub application_name: String,
    pub connected_at: SystemTime,
}

/// Logged-in clients by their cancel key (unique while they are connected).
#[derive(Default)]
pub struct ClientList {
    clients: Mutex<HashMap<(i32, i32), ClientEntry>>,
}

impl ClientList {
    pub fn add(&self, key: (i32, i32), entry: ClientEntry) {
        if let Ok(mut clients) = self.clients.lock() {
            clients.insert(key, entry);
        }
    }

    pub fn remove(&self, key: (i32, i32)) {
        if let Ok(mut clients) = self.clients.lock() {
            clients.remove(&key);
        }
    }

    /// SHOW CLIENTS rows of the clients `visible` lets through, oldest
    /// first: user, database, addr, port, tls, application_name,
    /// connect_time.
    pub fn rows(&self, visible: &dyn Fn(&str) -> bool) -> Vec<Vec<String>> {
        let Ok(clients) = self.clients.lock() else {
            return Vec::new();
        };
        let mut entries: Vec<&ClientEntry> = clients
            .values()
            .filter(|entry| visible(&entry.user))
            .collect();
        entries.sort_by_key(|entry| entry.connected_at);
        entries
            .into_iter()
            .map(|entry| {
                vec![
                    entry.user.clone(),
                    entry.database.clone(),
                    entry
                        .peer
                        .map(|peer| peer.ip().to_string())
                        .unwrap_or_default(),
                    entry
                        .peer
                        .map(|peer| peer.port().to_string())
                        .unwrap_or_default(),
                    entry.tls.clone().unwrap_or_default(),
                    entry.application_name.clone(),
                    utc_timestamp(entry.connected_at),
                ]
            })
            .collect()
    }
}

/// `2026-12-07 02:40:11+00` (as PostgreSQL prints a timestamptz in UTC).
fn utc_timestamp(time: SystemTime) -> String {
    let seconds = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, of_day) = ((seconds / 86_400) as i64, seconds % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}+00",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// The proleptic Gregorian date of a count of days since 1970-01-01
/// (Howard Hinnant's civil_from_days).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_print_in_utc() {
        assert_eq!(utc_timestamp(UNIX_EPOCH), "1970-01-01 00:00:00+00");
        // 2024-02-29 12:34:56 UTC (a leap day)
        let leap = UNIX_EPOCH + Duration::from_secs(1_709_210_096);
        assert_eq!(utc_timestamp(leap), "2024-02-29 12:34:56+00");
        let later = UNIX_EPOCH + Duration::from_secs(1_796_610_011);
        assert_eq!(utc_timestamp(later), "2026-12-07 02:20:11+00");
    }

    #[test]
    fn rows_follow_visibility_and_age() {
        let list = ClientList::default();
        let entry = |user: &str, at: u64, tls: Option<&str>| ClientEntry {
            user: user.into(),
            database: "app".into(),
            peer: "127.0.0.1:5555".parse().ok(),
            tls: tls.map(str::to_string),
            application_name: "psql".into(),
            connected_at: UNIX_EPOCH + Duration::from_secs(at),
        };
        list.add((1, 1), entry("bob", 20, None));
        list.add((2, 2), entry("alice", 10, Some("TLSv1.3/X")));
        let all = list.rows(&|_| true);
        assert_eq!(all.len(), 2);
        assert_eq!(all[0][0], "alice");
        assert_eq!(all[0][4], "TLSv1.3/X");
        assert_eq!(all[1][4], "");
        assert_eq!(list.rows(&|user| user == "bob").len(), 1);
        list.remove((1, 1));
        assert_eq!(list.rows(&|_| true).len(), 1);
    }
}
