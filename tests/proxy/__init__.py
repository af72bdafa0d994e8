"""The proxy: addons/ (the rules, prompt order, lanes, the diagnosis, the mitmproxy scripts) and captures/."""
