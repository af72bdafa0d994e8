"""The specifications, one folder per part of the tree; support/ and fixtures/ are theirs."""
