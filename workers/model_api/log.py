"""Logger: model logging into the worker's logger (LOGGER_NAME)."""

import enum
import logging


LOGGER_NAME = "shmserve.model"
_logger = logging.getLogger(LOGGER_NAME)


class Logger:
    """Model logging through the worker's logging setup (workers/__main__.py), which hands each
    record to the server log with its level; VERBOSE is logging.DEBUG, shown only while the
    server's verbose level is above 0."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    _LEVELS = {
        LogLevel.INFO: logging.INFO,
        LogLevel.WARNING: logging.WARNING,
        LogLevel.ERROR: logging.ERROR,
        LogLevel.VERBOSE: logging.DEBUG,
    }

    # A message must be a str and a level a LogLevel: pybind11's TypeError otherwise, as in
    # Triton.
    @staticmethod
    def log(message, level=LogLevel.INFO):
        if type(level) is not Logger.LogLevel:
            raise TypeError(f"the log level must be a Logger.LogLevel, found {type(level)}")
        _logger.log(Logger._LEVELS[level], _log_message(message), stacklevel=2)

    @staticmethod
    def log_info(message):
        _logger.info(_log_message(message), stacklevel=2)

    @staticmethod
    def log_warn(message):
        _logger.warning(_log_message(message), stacklevel=2)

    @staticmethod
    def log_error(message):
        _logger.error(_log_message(message), stacklevel=2)

    @staticmethod
    def log_verbose(message):
        _logger.debug(_log_message(message), stacklevel=2)


def _log_message(message) -> str:
    if not isinstance(message, str):
        raise TypeError(f"a log message must be a str, found {type(message)}")
    return message
