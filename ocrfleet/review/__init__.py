"""The back office: a web app over the database of record where people work the review
queue, the accounts they log in with, and what their decisions teach (training exports,
thresholds)."""
