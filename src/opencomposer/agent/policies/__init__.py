"""Policy implementations: ``scripted`` (oracle, no-op, any script), ``local`` (an in-process
engine), ``http`` (an OpenAI-compatible server). ``agent.policy.make_policy`` picks one by spec."""
