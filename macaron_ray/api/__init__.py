"""The API surfaces: Chat Completions, Responses and Anthropic Messages, thin over one TurnRunner."""
