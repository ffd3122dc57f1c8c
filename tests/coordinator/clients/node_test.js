// node-postgres against the coordinator: parameters, named prepared
// statements, transactions and errors. Usage: node node_test.js PORT DATABASE
const { Client } = require('pg');

let failures = 0;
function check(description, condition) {
  console.log((condition ? 'ok - ' : 'not ok - ') + 'node-postgres: ' + description);
  if (!condition) failures += 1;
}

(async () => {
  const client = new Client({ host: '127.0.0.1', port: Number(process.argv[2]), user: 'postgres',
                              database: process.argv[3] });
  await client.connect();
  let r = await client.query('SELECT owner FROM accounts WHERE id = $1', [42]);
  check('parameterized query', r.rows[0].owner === 'owner 42');
  const owners = [];
  for (const id of [1, 2, 3, 42]) {
    r = await client.query({ name: 'owner_by_id', text: 'SELECT owner FROM accounts WHERE id = $1', values: [id] });
    owners.push(r.rows[0].owner);
  }
  check('named prepared statement on every shard', owners.join(',') === 'owner 1,owner 2,owner 3,owner 42');
  await client.query('INSERT INTO accounts (id, owner, balance) VALUES ($1, $2, $3)', [5001, 'node', 3]);
  await client.query('BEGIN');
  await client.query('UPDATE accounts SET balance = balance + 5 WHERE id = $1', [5001]);
  r = await client.query('SELECT balance FROM accounts WHERE id = $1', [5001]);
  await client.query('COMMIT');
  const after = await client.query('SELECT balance FROM accounts WHERE id = $1', [5001]);
  check('transaction', Number(r.rows[0].balance) === 8 && Number(after.rows[0].balance) === 8);
  try {
    await client.query('INSERT INTO accounts VALUES ($1, $2, 0)', [42, 'dup']);
    check('duplicate refused', false);
  } catch (e) {
    check('error code ' + e.code, e.code === '23505');
  }
  // A transaction on two workers (accounts 7 and 42 live on different
  // ones): named prepared statements, a savepoint the second worker joins
  // after, two-phase commit.
  const balance = async (id) =>
    Number((await client.query('SELECT balance FROM accounts WHERE id = $1', [id])).rows[0].balance);
  const before = [await balance(42), await balance(7)];
  const move = { name: 'move_balance', text: 'UPDATE accounts SET balance = balance + $2 WHERE id = $1' };
  await client.query('BEGIN');
  await client.query({ ...move, values: [42, -1] });
  await client.query('SAVEPOINT s');
  await client.query({ ...move, values: [7, 1] });
  await client.query({ ...move, values: [42, -100] });
  await client.query('ROLLBACK TO SAVEPOINT s');
  await client.query({ ...move, values: [7, 1] });
  await client.query('COMMIT');
  const moved = [await balance(42), await balance(7)];
  check('transaction on two workers with a savepoint: ' + before + ' -> ' + moved,
        moved[0] === before[0] - 1 && moved[1] === before[1] + 1);
  r = await client.query('SELECT count(*)::int AS n FROM accounts');
  check('multi-shard query', r.rows[0].n > 100);
  await client.end();
  process.exit(failures ? 1 : 0);
})().catch((e) => { console.log('not ok - node-postgres: ' + e); process.exit(1); });
