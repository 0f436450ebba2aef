// Starts Swagger UI on the API's own OpenAPI document (a file, so the page needs no inline script).
window.ui = SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true });
