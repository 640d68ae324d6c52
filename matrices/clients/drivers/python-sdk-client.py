"""Drives the MCP Python SDK client (PyPI `mcp`, pinned in ../requirements.txt) against the MCP
server command given as arguments: initialize, tools/list, then two calls of the `capabilities`
tool, as a developer using the SDK would write it. The client names itself with the SDK's package
name and exact version, so the probe log records what was measured.
Usage: python3 python-sdk-client.py SERVER_COMMAND [ARGS...]"""

import asyncio
import sys
from importlib.metadata import version

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import Implementation


async def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python3 python-sdk-client.py SERVER_COMMAND [ARGS...]")
    sdk = version("mcp")
    params = StdioServerParameters(command=argv[0], args=argv[1:])
    async with stdio_client(params) as (read, write):
        async with ClientSession(
            read, write, client_info=Implementation(name="mcp", version=sdk)
        ) as session:
            await session.initialize()
            await session.list_tools()
            for _ in range(2):
                await session.call_tool("capabilities", {})
    print(f"python-sdk client {sdk}: two calls done", file=sys.stderr)


asyncio.run(main(sys.argv[1:]))
