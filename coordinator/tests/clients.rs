//! tokio-postgres against a running coordinator (binary parameters and
//! results, named statements, transactions, errors). Run by
//! tests/coordinator/run.sh with PGSHARD_COORDINATOR_URL set, after the
//! suites there created their tables:
//! `cargo test -p pg_shard_coordinator --test clients -- --ignored`.

use tokio_postgres::{error::SqlState, NoTls};

async fn connect() -> tokio_postgres::Client {
    let url = std::env::var("PGSHARD_COORDINATOR_URL")
        .expect("PGSHARD_COORDINATOR_URL names the coordinator to test");
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .expect("connect to the coordinator");
    tokio::spawn(connection);
    client
}

#[tokio::test]
#[ignore = "needs a running cluster and coordinator (tests/coordinator/run.sh)"]
async fn binary_parameters_route_to_every_shard() {
    let client = connect().await;
    let statement = client
        .prepare("SELECT owner, balance::text FROM accounts WHERE id = $1")
        .await
        .unwrap();
    for id in [1i64, 2, 3, 42, 99] {
        let row = client.query_one(&statement, &[&id]).await.unwrap();
        assert_eq!(row.get::<_, String>(0), format!("owner {id}"));
    }
    // an int4 parameter for a bigint key, declared by the client
    let typed = client
        .prepare_typed(
            "SELECT owner FROM accounts WHERE id = $1::int4",
            &[tokio_postgres::types::Type::INT4],
        )
        .await
        .unwrap();
    let row = client.query_one(&typed, &[&42i32]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "owner 42");
}

#[tokio::test]
#[ignore = "needs a running cluster and coordinator (tests/coordinator/run.sh)"]
async fn transactions_and_errors() {
    let mut client = connect().await;
    client
        .execute(
            "INSERT INTO accounts (id, owner, balance) VALUES ($1, 'tokio', 4)",
            &[&5002i64],
        )
        .await
        .unwrap();
    let transaction = client.transaction().await.unwrap();
    transaction
        .execute(
            "UPDATE accounts SET balance = balance + 1 WHERE id = $1",
            &[&5002i64],
        )
        .await
        .unwrap();
    let balance: String = transaction
        .query_one(
            "SELECT balance::text FROM accounts WHERE id = $1",
            &[&5002i64],
        )
        .await
        .unwrap()
        .get(0);
    transaction.rollback().await.unwrap();
    let after: String = client
        .query_one(
            "SELECT balance::text FROM accounts WHERE id = $1",
            &[&5002i64],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(balance, "5");
    assert_eq!(after, "4");
    let error = client
        .execute(
            "INSERT INTO accounts (id, owner, balance) VALUES ($1, 'dup', 0)",
            &[&42i64],
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), Some(&SqlState::UNIQUE_VIOLATION));
    // the connection keeps working, also for multi-shard statements
    let count: i64 = client
        .query_one("SELECT count(*) FROM accounts", &[])
        .await
        .unwrap()
        .get(0);
    assert!(count > 100);
}

#[tokio::test]
#[ignore = "needs a running cluster and coordinator (tests/coordinator/run.sh)"]
async fn text_keys_and_pipelined_queries() {
    let client = connect().await;
    // reference table by text key, and several queries in flight at once
    let (a, b, c) = tokio::join!(
        client.query_one("SELECT name FROM currencies WHERE code = $1", &[&"EUR"]),
        client.query_one("SELECT owner FROM accounts WHERE id = $1", &[&7i64]),
        client.query_one("SELECT owner FROM accounts WHERE id = $1", &[&42i64]),
    );
    assert_eq!(a.unwrap().get::<_, String>(0), "Euro");
    assert_eq!(b.unwrap().get::<_, String>(0), "owner 7");
    assert_eq!(c.unwrap().get::<_, String>(0), "owner 42");
}
