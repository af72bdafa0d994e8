"""The coding agents stable-prefix points at a stack, one module per agent: its pinned release and install, the
environment or arguments that point it at the proxy, a driver that runs it in a scratch HOME and project, and its
record, `AGENT` (`base.CodingAgent`: package and pin, protocol, launcher, conversation driver, what it does after a cut
stream, its lane facts).

roster.py is the one list of the records, which the CLI, the bench, the tests' fixtures and the proxy's lanes read;
base.py the record; npm_package.py the pinned npm install every agent shares; scratch_project.py the throwaway HOME
and git project (and `Sandbox`, with the agent's own config folder); driver.py the driver's shape.
`python -m stable_prefix.agents.<agent> install` installs one. Nothing here imports the engine: the proxy reads the
records.
"""
