// Drives the MCP TypeScript SDK client (@modelcontextprotocol/sdk, pinned in ../package.json)
// against the MCP server command given as arguments: initialize, tools/list, then two calls of
// the `capabilities` tool, as a developer using the SDK would write it. The client names itself
// with the SDK's package name and exact version, so the probe log records what was measured.
// Usage: node ts-sdk-client.mjs SERVER_COMMAND [ARGS...]
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

// The package's own package.json (its `exports` hide it from require.resolve).
const pkgPath = new URL("../node_modules/@modelcontextprotocol/sdk/package.json", import.meta.url);
const version = JSON.parse(readFileSync(pkgPath, "utf8")).version;
const [command, ...args] = process.argv.slice(2);
if (!command) {
  console.error("usage: node ts-sdk-client.mjs SERVER_COMMAND [ARGS...]");
  process.exit(2);
}
const client = new Client({ name: "@modelcontextprotocol/sdk", version });
await client.connect(new StdioClientTransport({ command, args, stderr: "inherit" }));
await client.listTools();
for (let i = 0; i < 2; i++) {
  await client.callTool({ name: "capabilities", arguments: {} });
}
await client.close();
console.error(`ts-sdk client ${version}: two calls done`);
