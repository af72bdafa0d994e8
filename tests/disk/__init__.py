"""The disk tier under the RAM cache: snapshot files, their directory and budget, the model's identity, restarts."""
