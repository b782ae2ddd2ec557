"""Tools a chat's model may call: the app's own and those of MCP servers, below the UI.

    spec.py          ToolSpec (a tool as the model sees it) and ToolOutcome (what a call gave back)
    arithmetic.py    exact arithmetic over integers, fractions and decimals, without eval()
    builtin.py       the tools that need no server: the date and time, arithmetic
    loop_thread.py   LoopThread: an asyncio loop of its own in a worker thread, for MCP sessions
    mcp_client.py    McpServerConfig and McpClient: one MCP server (stdio or streamable HTTP) through the SDK
    registry.py      ToolRegistry: the built-ins and every configured server's tools under one name each
    toolbox.py       ToolBox: one chat's switched-on tools, what the service's tool loop calls

Nothing here touches Qt: the service drives it from its event loop, and no call blocks the GUI thread.
"""
