"""The coding agents stable-prefix points at a stack, one module per agent: its pinned release and install, the
environment or arguments that point it at the proxy, and a driver that runs it in a scratch HOME and project.

npm_package.py is the pinned npm install every agent shares; scratch_project.py the throwaway HOME and git project.
`python -m stable_prefix.agents.<agent> install` installs one.
"""
