"""Runs one agent of the OpenAI Agents SDK (PyPI `openai-agents`, pinned in ../requirements.txt)
the way its documentation shows: an `Agent` whose model is `OpenAIChatCompletionsModel` over an
`AsyncOpenAI` client, with one stdio MCP server whose tool list is cached (the documented
`cache_tools_list=True`: without it the SDK lists the tools again before every model turn, and a
frozen server then fails the `tools/list` rather than the call), run once with `Runner.run`. `callid measure`
points the model at its scripted Chat Completions endpoint and the MCP server at `callid probe`.
Tracing is turned off, so nothing leaves the machine.

Usage: python openai-agents-client.py BASE_URL TOOL_TIMEOUT_SECONDS PROMPT SERVER_COMMAND [ARGS...]"""

import asyncio
import sys

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from agents.mcp import MCPServerStdio
from openai import AsyncOpenAI


async def main(argv: list[str]) -> None:
    if len(argv) < 4:
        sys.exit(
            "usage: python openai-agents-client.py BASE_URL TOOL_TIMEOUT_SECONDS PROMPT "
            "SERVER_COMMAND [ARGS...]"
        )
    base_url, timeout, prompt, command, args = argv[0], float(argv[1]), argv[2], argv[3], argv[4:]
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(
        model="scripted-model",
        openai_client=AsyncOpenAI(base_url=base_url, api_key="scripted-offline-key", max_retries=0),
    )
    async with MCPServerStdio(
        name="probe",
        params={"command": command, "args": args},
        client_session_timeout_seconds=timeout,
        cache_tools_list=True,
    ) as server:
        agent = Agent(name="probe-caller", model=model, mcp_servers=[server])
        result = await Runner.run(agent, prompt, max_turns=12)
        print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
