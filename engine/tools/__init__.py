"""Tool calling: a model's calls read from its answer, and held to their tools' schemas while it writes them.

    schema.py         Tool, ToolChoice and ToolError: OpenAI's `tools` and `tool_choice`, checked
    calls.py          ToolCall (whole), CallDelta and ToolDelta (streamed)
    formats.py        which family's syntax a model writes, from its chat template
    family.py         ToolFamily: a syntax as a parser and a grammar
    hermes.py         <tool_call>{json}</tool_call> (Hermes, Qwen; the generic form) and Phi-4-mini's tags
    llama3.py         Llama 3's bare {"name", "parameters"} object
    mistral.py        [TOOL_CALLS][...] and [TOOL_CALLS]name[ARGS]{...}
    harmony_calls.py  gpt-oss's commentary messages to functions.*
    stream.py         ToolCallParser: the base of the families' streaming parsers
    jsonscan.py       where a streamed JSON value ends; a call object's name and arguments as they arrive
    grammar.py        llguidance lark grammars: markers, inline schemas, the reasoning block
    messages.py       calls and results in the messages a template renders
    use.py            ToolUse: one request's tools, from messages to the job's filter and parser

Nothing is imported here: importers name the module they need.
"""
