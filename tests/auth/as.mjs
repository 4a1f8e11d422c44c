// A real OAuth 2.1 authorization server for the authorization tests: oidc-provider
// (pinned in package.json / package-lock.json), on a free loopback port.
//
//   node as.mjs <config.json>
//
// config.json: { "resources": [canonical URIs], "ttl": seconds, "tokens": path,
//                "clients": [{ "id", "secret", "scope" }] }
//
// Client-credentials grant only, resource indicators (RFC 8707) required, JWT access
// tokens (RFC 9068) signed RS256 with the given lifetime. Every access token issued is
// appended to the `tokens` file (one per line) so the harness can grep the logs of the
// programs under test for each of them. A line "rotate" on stdin switches to a new
// signing key (the old one stays published), to exercise JWKS refresh on unknown `kid`.
// Prints "issuer <url>" on stdout when ready.

import { readFileSync, appendFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { createInterface } from 'node:readline';
import Provider, { errors } from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));

function signingKey() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), alg: 'RS256', use: 'sig' };
}

function provider(issuer, keys) {
  const p = new Provider(issuer, {
    clients: config.clients.map((c) => ({
      client_id: c.id,
      client_secret: c.secret,
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      token_endpoint_auth_method: 'client_secret_basic',
      scope: c.scope,
    })),
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
            jwt: { sign: { alg: 'RS256', kid: keys[0].kid } },
          };
        },
      },
    },
  });
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
  const first = signingKey();
  let current = provider(issuer, [first]);
  server.on('request', (req, res) => current.callback()(req, res));
  createInterface({ input: process.stdin }).on('line', (line) => {
    if (line.trim() === 'rotate') {
      current = provider(issuer, [signingKey(), first]);
      process.stdout.write('rotated\n');
    }
  });
  process.stdout.write(`issuer ${issuer}\n`);
});
