"""What the agent reports, in the cluster and back to git.

The modules are imported directly (nothing is re-exported here, so importing one, as the hub
does with :mod:`agent.report.seal`, does not load the others):

- :mod:`agent.report.runs`: each bundle's run history, kept in the cluster (``RunLog``);
- :mod:`agent.report.outputs`: declared outputs read after a successful run
  (``read_outputs``), the ``BundleOutputs`` object and the Secret of sensitive values
  (``OutputsWriter``), and their status-document form (``status_outputs``);
- :mod:`agent.report.seal`: sensitive output values sealed to the hub's key;
- :mod:`agent.report.push`: the status document pushed to ``fleetlet/status/<cluster>``.
"""
