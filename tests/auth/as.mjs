// A real OAuth 2.1 authorization server for the authorization tests: oidc-provider
// (pinned in package.json / package-lock.json), on a free loopback port.
//
//   node as.mjs <config.json>
//
// config.json: { "resources": [canonical URIs], "ttl": seconds, "tokens": path,
//                "clients": [{ "id", "secret", "scope", "shape"? }] }
//
// config.exchange (optional): { "client", "secret", "from": [audiences a subject token
// may have], "to": [resources an exchanged token may be for], "log": path } registers
// a confidential client that may use the token exchange grant (RFC 8693, below); each
// token it issues is also appended to `log`.
//
// A client's "shape" makes its tokens look like those of another identity provider
// (the tokens stay signed by this server's keys, published at <issuer>/jwks):
//   "typ": header typ ("JWT"; null: no typ at all)   "iss": suffix of the issuer
//   "aud": audience instead of the resource          "scope_claim": claim scopes go in
//   "scope_array": scopes as an array of strings      "claims": extra claims
//
// Client-credentials grant only, resource indicators (RFC 8707) required, JWT access
// tokens (RFC 9068) signed RS256 with the given lifetime. Every access token issued is
// appended to the `tokens` file (one per line) so the harness can grep the logs of the
// programs under test for each of them. A line "rotate <RS256|ES256|EdDSA>" on stdin
// switches to a new signing key of that algorithm (the old ones stay published), to
// exercise JWKS refresh on an unknown `kid` and every algorithm the server accepts.
// Prints "issuer <url>" on stdout when ready.

import { readFileSync, appendFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { createInterface } from 'node:readline';
import Provider, { errors } from 'oidc-provider';
import { SignJWT, createLocalJWKSet, jwtVerify, importJWK } from 'jose';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));

const KEY_TYPES = {
  RS256: ['rsa', { modulusLength: 2048 }],
  ES256: ['ec', { namedCurve: 'P-256' }],
  EdDSA: ['ed25519', {}],
};

function signingKey(alg = 'RS256') {
  const [type, options] = KEY_TYPES[alg];
  const { privateKey } = generateKeyPairSync(type, options);
  return { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), alg, use: 'sig' };
}

// Rewrites an access token to a client's shape (see the header of this file).
function shaped(issuer, token, jwt) {
  const client = config.clients.find((c) => c.id === token.clientId);
  const shape = client && client.shape;
  if (!shape) return;
  if ('typ' in shape) jwt.header = { typ: shape.typ === null ? undefined : shape.typ };
  if (shape.iss) jwt.payload.iss = issuer + shape.iss;
  if (shape.aud) jwt.payload.aud = shape.aud;
  if (shape.scope_claim) {
    const scope = jwt.payload.scope || '';
    delete jwt.payload.scope;
    jwt.payload[shape.scope_claim] = shape.scope_array ? scope.split(' ').filter(Boolean) : scope;
  }
  Object.assign(jwt.payload, shape.claims || {});
}

const EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN = 'urn:ietf:params:oauth:token-type:access_token';

// RFC 8693 for config.exchange.client: the subject token must be an access token this
// server issued (signature, issuer, expiry) for one of `from`; the new one is for the
// `resource` asked (one of `to`), keeps the subject's `sub` and scope, names the
// gateway as `client_id` and as actor (`act`, §4.1), and lives `ttl` seconds.
function exchangeGrant(issuer, keys) {
  const publicKeys = keys.map(({ d, p, q, dp, dq, qi, ...pub }) => pub);
  const jwks = createLocalJWKSet({ keys: publicKeys });
  return async (ctx) => {
    const { client, params } = ctx.oidc;
    const ex = config.exchange;
    if (!ex || client.clientId !== ex.client) throw new errors.UnauthorizedClient();
    if (params.subject_token_type !== ACCESS_TOKEN) {
      throw new errors.InvalidRequest('subject_token_type must be an access token');
    }
    let subject;
    try {
      ({ payload: subject } = await jwtVerify(params.subject_token, jwks, { issuer }));
    } catch {
      throw new errors.InvalidGrant('the subject token is not valid');
    }
    const aud = [].concat(subject.aud);
    if (!aud.some((a) => ex.from.includes(a))) {
      throw new errors.InvalidGrant('the subject token is not for this client');
    }
    if (!ex.to.includes(params.resource)) throw new errors.InvalidTarget();
    const [key] = keys;
    const now = Math.floor(Date.now() / 1000);
    const token = await new SignJWT({
      scope: subject.scope, client_id: ex.client, act: { sub: ex.client },
    })
      .setProtectedHeader({ alg: key.alg, kid: key.kid, typ: 'at+jwt' })
      .setIssuer(issuer).setSubject(subject.sub).setAudience(params.resource)
      .setIssuedAt(now).setExpirationTime(now + config.ttl).setJti(randomUUID())
      .sign(await importJWK(key, key.alg));
    ctx.body = {
      access_token: token, issued_token_type: ACCESS_TOKEN, token_type: 'Bearer', expires_in: config.ttl,
    };
    appendFileSync(ex.log, `${token}\n`);
  };
}

function provider(issuer, keys) {
  const exchangeClient = config.exchange ? [{
    client_id: config.exchange.client,
    client_secret: config.exchange.secret,
    grant_types: [EXCHANGE],
    redirect_uris: [],
    response_types: [],
    token_endpoint_auth_method: 'client_secret_basic',
  }] : [];
  const p = new Provider(issuer, {
    formats: { customizers: { jwt: (ctx, token, jwt) => shaped(issuer, token, jwt) } },
    clients: config.clients.map((c) => ({
      client_id: c.id,
      client_secret: c.secret,
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      token_endpoint_auth_method: 'client_secret_basic',
      scope: c.scope,
    })).concat(exchangeClient),
    scopes: ['notes:read', 'notes:write'],
    jwks: { keys },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => undefined,
        useGrantedResource: () => true,
        getResourceServerInfo: (ctx, resource) => {
          if (!config.resources.includes(resource)) {
            throw new errors.InvalidTarget();
          }
          return {
            scope: 'notes:read notes:write',
            audience: resource,
            accessTokenTTL: config.ttl,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: keys[0].alg, kid: keys[0].kid } },
          };
        },
      },
    },
  });
  p.registerGrantType(EXCHANGE, exchangeGrant(issuer, keys),
    ['subject_token', 'subject_token_type', 'requested_token_type', 'resource', 'audience', 'scope']);
  p.use(async (ctx, next) => {
    await next();
    if (ctx.path === '/token' && ctx.body && ctx.body.access_token) {
      appendFileSync(config.tokens, `${ctx.body.access_token}\n`);
    }
  });
  return p;
}

const server = createServer();
server.listen(0, '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  let keys = [signingKey()];
  let current = provider(issuer, keys);
  server.on('request', (req, res) => current.callback()(req, res));
  createInterface({ input: process.stdin }).on('line', (line) => {
    const [command, alg] = line.trim().split(' ');
    if (command === 'rotate' && KEY_TYPES[alg]) {
      keys = [signingKey(alg), ...keys];
      current = provider(issuer, keys);
      process.stdout.write(`rotated ${alg}\n`);
    }
  });
  process.stdout.write(`issuer ${issuer}\n`);
});
