"""The shop's HTTP API (FastAPI): each request takes a connection from the app's pool."""

from typing import Annotated, Any

from fastapi import Depends, FastAPI

from shop.accounts import sign_up

app = FastAPI()


def get_conn():
    from shop.pool import pool

    with pool().connection() as conn:
        yield conn


Connection = Annotated[Any, Depends(get_conn)]


@app.post("/signup")
def signup(email: str, conn: Connection):
    return {"user_id": sign_up(conn, email)}
