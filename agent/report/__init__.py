"""Status back to git: the status document pushed to ``fleetlet/status/<cluster>``
(:mod:`agent.report.push`) and sensitive outputs sealed to the hub's key
(:mod:`agent.report.seal`)."""
