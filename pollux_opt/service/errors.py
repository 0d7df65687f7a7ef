"""The API's error answers (the app renders them as ``{"error": message}``)."""

__all__ = ["ApiError"]


class ApiError(Exception):
    """An answer other than 2xx: HTTP ``status`` and the message of its ``{"error"}`` body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message
