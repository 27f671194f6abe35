"""The agent harness: tools, the tool-call text protocol, the loop, and the policies that drive it.

Read in this order: ``tools`` (what the agent can do), ``protocol`` (how turns are written and
tokenised), ``loop`` (one episode), ``policy`` (the ``Policy`` protocol and the spec registry),
``policies/`` (scripted, local engine, OpenAI-compatible HTTP).
"""
