// node-postgres over TLS to the coordinator. Usage:
//   node tls_node.js REQUIRE_PORT DATABASE CA_FILE OTHER_CA_FILE
// REQUIRE_PORT: a coordinator with tls = require and a certificate for
// 127.0.0.1 signed by CA_FILE (tests/coordinator/run.sh).
const fs = require('fs');
const { Client } = require('pg');

const [port, database, caFile, otherCaFile] = process.argv.slice(2);
let failures = 0;
function check(description, condition, detail) {
  console.log((condition ? 'ok - ' : 'not ok - ') + 'node-postgres tls: ' + description +
              (!condition && detail ? ` (${detail})` : ''));
  if (!condition) failures += 1;
}

function client(ssl) {
  return new Client({ host: '127.0.0.1', port: Number(port), user: 'postgres', database, ssl,
                      connectionTimeoutMillis: 10000 });
}

(async () => {
  // The certificate checked against the test CA, and its name (127.0.0.1).
  const secure = client({ ca: fs.readFileSync(caFile), rejectUnauthorized: true });
  await secure.connect();
  let r = await secure.query('SELECT $1::int + 1 AS n', [41]);
  check('a parameterized query over a verified session', r.rows[0].n === 42);
  r = await secure.query("SELECT string_agg(repeat('y', 1000), '') AS big FROM generate_series(1, 3000)");
  check('a 3 MB value arrives whole', r.rows[0].big.length === 3000000 && /^y+$/.test(r.rows[0].big));
  await secure.query('BEGIN');
  r = await secure.query({ name: 'twice', text: 'SELECT $1::text || $1::text AS t', values: ['ab'] });
  await secure.query('COMMIT');
  check('a named prepared statement in a transaction', r.rows[0].t === 'abab');
  await secure.end();

  // Another CA's view: the coordinator's certificate is not trusted.
  try {
    const wrong = client({ ca: fs.readFileSync(otherCaFile), rejectUnauthorized: true });
    await wrong.connect();
    await wrong.end();
    check('a certificate of another CA is refused', false, 'connected');
  } catch (e) {
    check('a certificate of another CA is refused', /self[- ]signed|unable to verify|certificate/i.test(e.message), e.message);
  }

  // A plain client is refused, and told why.
  try {
    const plain = client(false);
    await plain.connect();
    await plain.query('SELECT 1');
    await plain.end();
    check('a plain client is refused by tls = require', false, 'connected');
  } catch (e) {
    check('a plain client is refused by tls = require', /accepts only TLS connections/.test(e.message), e.message);
  }
  process.exit(failures ? 1 : 0);
})().catch((e) => {
  console.log('not ok - node-postgres tls: ' + e.message);
  process.exit(1);
});
